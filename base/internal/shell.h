// Text meant to be pasted into a shell: the commands a report or a run analysis suggests.
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_BASE_INTERNAL_SHELL_H_
#define CAPSULE_BASE_INTERNAL_SHELL_H_

#include <string>

namespace capsule {

// `s` as one shell word: as it is when it holds only letters, digits and "._-+/", else in single
// quotes.
std::string ShellQuote(const std::string& s);

}  // namespace capsule

#endif  // CAPSULE_BASE_INTERNAL_SHELL_H_
