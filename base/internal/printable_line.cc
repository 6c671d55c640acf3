#include "capsule/base/internal/printable_line.h"

#include "capsule/base/internal/printable.h"

namespace capsule {

PrintableLine::~PrintableLine() { out_ << Printable(text_.str()) << '\n'; }

}  // namespace capsule
