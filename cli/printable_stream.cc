#include "capsule/cli/printable_stream.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "capsule/base/internal/printable.h"

namespace capsule::cli {

PrintableStreamBuf::~PrintableStreamBuf() { Finish(); }

void PrintableStreamBuf::Failed() {
  if (!failed_) failed_errno_ = errno;
  failed_ = true;
}

bool PrintableStreamBuf::Forward(bool all) {
  const size_t cut = all ? pending_.size() : CompleteUtf8Prefix(pending_);
  if (cut == 0) return !failed_;
  const std::string out = Printable(std::string_view(pending_).substr(0, cut), LineBreaks::kKeep);
  pending_.erase(0, cut);
  const auto n = static_cast<std::streamsize>(out.size());
  if (sink_->sputn(out.data(), n) != n) Failed();
  return !failed_;
}

PrintableStreamBuf::int_type PrintableStreamBuf::overflow(int_type ch) {
  if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
  pending_ += traits_type::to_char_type(ch);
  // Forward at line ends so that output interleaves with other writers as it did unfiltered.
  if (ch == '\n' && !Forward(false)) return traits_type::eof();
  return ch;
}

std::streamsize PrintableStreamBuf::xsputn(const char* s, std::streamsize n) {
  pending_.append(s, static_cast<size_t>(n));
  return Forward(false) ? n : 0;
}

int PrintableStreamBuf::sync() {
  if (!Forward(false)) return -1;
  if (sink_->pubsync() != 0) Failed();
  return failed_ ? -1 : 0;
}

bool PrintableStreamBuf::Finish() {
  Forward(true);
  if (sink_->pubsync() != 0) Failed();
  return !failed_;
}

namespace {

// Standard error before the filter, while PrintableStreams is installed: where ProgressLine
// writes its control sequences.
std::streambuf* g_raw_err = nullptr;

void WriteProgress(const std::string& text) {
  std::cerr.flush();  // what the filter holds goes first
  const std::string line = "\r\033[K" + text;
  std::streambuf* sink = g_raw_err != nullptr ? g_raw_err : std::cerr.rdbuf();
  sink->sputn(line.data(), static_cast<std::streamsize>(line.size()));
  sink->pubsync();
}

}  // namespace

PrintableStreams::PrintableStreams()
    : old_out_(std::cout.rdbuf()),
      old_err_(std::cerr.rdbuf()),
      out_(std::make_unique<PrintableStreamBuf>(old_out_)),
      err_(std::make_unique<PrintableStreamBuf>(old_err_)) {
  std::cout.rdbuf(out_.get());
  std::cerr.rdbuf(err_.get());
  g_raw_err = old_err_;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigpipe_swapped_ = ::sigaction(SIGPIPE, &ignore, &old_sigpipe_) == 0;
}

PrintableStreams::~PrintableStreams() {
  // Whatever is still held goes out; a write error now has no one left to report it to.
  (void)Finish();
  g_raw_err = nullptr;
  std::cout.rdbuf(old_out_);
  std::cerr.rdbuf(old_err_);
  if (sigpipe_swapped_) ::sigaction(SIGPIPE, &old_sigpipe_, nullptr);
}

std::function<void(const std::string&)> ProgressLine(const std::string& command) {
  if (!::isatty(2)) return nullptr;
  return
      [command](const std::string& text) { WriteProgress("[" + command + "] " + Printable(text)); };
}

void ClearProgressLine() {
  if (::isatty(2)) WriteProgress("");
}

Status PrintableStreams::Finish() {
  std::cerr.flush();
  err_->Finish();
  std::cout.flush();
  bool ok = out_->Finish() && std::cout.good();
  int err = out_->failed_errno();
  // std::cout writes through C stdio: its buffer is flushed here, and that is where a full disk
  // usually shows.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    ok = false;
    if (err == 0) err = errno;
  }
  if (ok) return Status::Ok();
  std::clearerr(stdout);
  std::cout.clear();
  return DataLossError(std::string("write error: standard output: ") +
                       (err != 0 ? std::strerror(err) : "the output stream failed"));
}

}  // namespace capsule::cli
