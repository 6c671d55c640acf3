// PrintableLine: one line of text, laid out from pieces that may come from a capsule or a file
// name, that no piece can end early or multiply.
//
// Printable (base/internal/printable.h) escapes one string. A line of a command's output is made of
// many: "gate: ", a count, a file name, a model's name. Everything streamed into a PrintableLine is
// escaped as Printable escapes a one-line field (a line break inside a piece shows as "\n"), and
// the line, with the one "\n" that ends it, goes to the stream when the PrintableLine goes out of
// scope. So a file name or a model name holding "\ngate: 3 of 3 capsules no longer fail" shows as
// part of its own line, never as a line of its own.
//
//   capsule::PrintableLine(std::cout) << "gate: " << passed << " of " << total << " pass";
//   capsule::PrintableLine(std::cout);   // an empty line
//
// The CLI's streams (cli/printable_stream.h) escape controls in everything written, but pass line
// breaks: they see bytes, and cannot tell a break a command lays out from one inside a field. A
// line that holds a field is therefore written through PrintableLine, or built by a renderer that
// escapes each field (report/).
//
// Thread safety: a PrintableLine is used by one thread; distinct ones are independent.
#ifndef CAPSULE_BASE_INTERNAL_PRINTABLE_LINE_H_
#define CAPSULE_BASE_INTERNAL_PRINTABLE_LINE_H_

#include <ostream>
#include <sstream>

namespace capsule {

class PrintableLine {
 public:
  explicit PrintableLine(std::ostream& out) : out_(out) {}
  // Writes the escaped line and its "\n".
  ~PrintableLine();
  PrintableLine(const PrintableLine&) = delete;
  PrintableLine& operator=(const PrintableLine&) = delete;

  // Anything std::ostream prints; it is escaped when the line is written.
  template <typename T>
  PrintableLine& operator<<(const T& piece) {
    text_ << piece;
    return *this;
  }

 private:
  std::ostream& out_;
  std::ostringstream text_;
};

}  // namespace capsule

#endif  // CAPSULE_BASE_INTERNAL_PRINTABLE_LINE_H_
