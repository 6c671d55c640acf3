// The CLI's standard output and error, made safe for a terminal and checked for write errors.
// Internal to the CLI.
//
// PrintableStreams swaps the stream buffers of std::cout and std::cerr for filters that pass
// everything written through Printable(..., LineBreaks::kKeep) (base/internal/printable.h) on its
// way out, so no control sequence from a capsule or a file name reaches the terminal raw, whichever
// code printed it. Line breaks pass: the filter sees bytes, and a break the command lays out looks
// like one inside a field. What keeps a field on its line is how the line is written: through
// PrintableLine (base/internal/printable_line.h), or by a renderer that escapes each field
// (report/). Finish() flushes both and reports a failed write to standard output ("write error:
// standard output: No space left on device"), which the command turns into exit status 2. While
// they are installed SIGPIPE is ignored, so a pipe whose reader went away (`capsule report FILE |
// head -c 10`) is such a write error ("Broken pipe", exit 2) instead of a silent death by signal
// (exit 141).
#ifndef CAPSULE_CLI_PRINTABLE_STREAM_H_
#define CAPSULE_CLI_PRINTABLE_STREAM_H_

#include <signal.h>

#include <functional>
#include <memory>
#include <ostream>
#include <streambuf>
#include <string>

#include "capsule/base/status.h"

namespace capsule::cli {

// A streambuf that escapes what is written to it and forwards it to `sink` (not owned).
// A UTF-8 character split across two writes is held until its last byte arrives.
class PrintableStreamBuf : public std::streambuf {
 public:
  explicit PrintableStreamBuf(std::streambuf* sink) : sink_(sink) {}
  ~PrintableStreamBuf() override;

  // Escapes and forwards what is held (a character left unfinished is escaped byte by byte) and
  // flushes the sink; false when any write to the sink failed since construction.
  bool Finish();

 protected:
  int_type overflow(int_type ch) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  int sync() override;

 private:
  bool Forward(bool all);
  void Failed();  // records the first failure and its errno

  std::streambuf* sink_;
  std::string pending_;
  bool failed_ = false;
  int failed_errno_ = 0;  // errno at the first failed write to the sink

 public:
  int failed_errno() const { return failed_errno_; }
};

// Installs the filters on std::cout and std::cerr, and ignores SIGPIPE, for its lifetime (the
// signal's disposition is put back after: a trainer or Python process embedding the CLI keeps its
// own).
class PrintableStreams {
 public:
  PrintableStreams();
  ~PrintableStreams();
  PrintableStreams(const PrintableStreams&) = delete;
  PrintableStreams& operator=(const PrintableStreams&) = delete;

  // Flushes both streams. kDataLoss "write error: standard output: ..." when anything written to
  // standard output was lost (a full disk, a closed pipe); a failure to write standard error is
  // not reported (there is nowhere to report it).
  Status Finish();

 private:
  std::streambuf* old_out_;
  std::streambuf* old_err_;
  struct sigaction old_sigpipe_ {};
  bool sigpipe_swapped_ = false;
  std::unique_ptr<PrintableStreamBuf> out_;
  std::unique_ptr<PrintableStreamBuf> err_;
};

// A progress line on the terminal, redrawn in place: "\r\033[K[COMMAND] TEXT". Null when standard
// error is not a terminal. The carriage return and the erase-line sequence reach the terminal as
// they are, the one exception to the filter; TEXT, which may name the capsule's model or layers,
// is escaped onto the line. ClearProgressLine() erases it.
std::function<void(const std::string&)> ProgressLine(const std::string& command);
void ClearProgressLine();

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_PRINTABLE_STREAM_H_
