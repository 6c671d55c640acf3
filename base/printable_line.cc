#include "capsule/base/printable_line.h"

#include "capsule/base/printable.h"

namespace capsule {

PrintableLine::~PrintableLine() { out_ << Printable(text_.str()) << '\n'; }

}  // namespace capsule
