// Search strategies that name the first bad layer of a model from yes/no probes.
//
// Replay builds composite runs of an N-layer model: configuration k runs layers [0, k) on the
// OPTIMIZED path and layers [k, N) on the REFERENCE path, and an oracle answers whether the run is
// "bad" (its final output diverges from the all-reference run). Configuration 0 is the reference
// itself and is never probed. If layer b is the first bad layer, configuration k is bad exactly
// when k > b, so the answers are monotone in k: good for k <= b, bad for k > b. Search() finds the
// smallest k in [1, N] whose probe is bad and reports first_bad = k - 1; probing k = N (everything
// optimized) is the "does the failure reproduce" check, and when it is not bad there is no bad
// layer. Strategies are small objects (BisectStrategy, LinearStrategy) that only choose which k to
// probe next; Search() calls the oracle, never asks for the same k twice, records every answer,
// stops at the first oracle error, and lists the monotonicity violations it observed.
//
//   capsule::bisect::BisectStrategy strategy;
//   capsule::bisect::SearchResult r = capsule::bisect::Search(strategy, num_layers, [&](size_t k) {
//     return capsule::bisect::OracleAnswer::FromBool(CompositeDiverges(k));
//   });
//   if (!r.ok()) return Error(r.error);
//   if (r.first_bad) Report("first bad layer", *r.first_bad, r.probes);
//
// Non-monotone oracles: monotonicity is an assumption (a later layer can mask an earlier bad
// layer's error, or a nondeterministic kernel can flip answers). Search() then still terminates and
// first_bad is the smallest bad k it observed, minus one. BisectStrategy sees only O(log N) points,
// so it may return some k whose predecessor probed good (a real good-to-bad transition, but not
// necessarily the first one) or report no bad layer when k = N happens to be good; use
// LinearStrategy with scan_all to probe every k and get the violations listed.
//
// Thread safety: a strategy object holds per-search state and is used by one Search() at a time.
// Search() calls the oracle sequentially from the calling thread. Results are plain values.
#ifndef CAPSULE_BISECT_SEARCH_H_
#define CAPSULE_BISECT_SEARCH_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace capsule {
namespace bisect {

// One oracle answer: good, bad, or an error that stops the search. This module depends on nothing,
// so it carries its own tiny result type instead of capsule::Status; callers convert at the edge.
class OracleAnswer {
 public:
  static OracleAnswer Good() { return OracleAnswer(Kind::kGood, {}); }
  static OracleAnswer Bad() { return OracleAnswer(Kind::kBad, {}); }
  static OracleAnswer FromBool(bool bad) { return bad ? Bad() : Good(); }
  // `message` should say what failed ("composite run k=3: out of memory"); an empty message is
  // replaced by a generic one so that an error is never silent.
  static OracleAnswer Error(std::string message);

  bool ok() const { return kind_ != Kind::kError; }
  bool bad() const { return kind_ == Kind::kBad; }
  const std::string& error() const { return error_; }  // empty unless !ok()

 private:
  enum class Kind { kGood, kBad, kError };
  OracleAnswer(Kind kind, std::string error) : kind_(kind), error_(std::move(error)) {}

  Kind kind_;
  std::string error_;
};

// Answers whether configuration k (1 <= k <= n) is bad. An exception thrown by the oracle is
// caught by Search() and treated like OracleAnswer::Error(what()).
using Oracle = std::function<OracleAnswer(size_t k)>;

struct Probe {
  size_t k = 0;
  bool bad = false;
};

// Evidence that the answers are not monotone: probe(bad_k) was bad but probe(good_k) was good
// although good_k > bad_k. bad_k is the nearest bad probe below good_k.
struct MonotonicityViolation {
  size_t bad_k = 0;
  size_t good_k = 0;
};

struct SearchResult {
  // The first bad layer (smallest bad k minus one); nullopt when no probe was bad, or on error.
  std::optional<size_t> first_bad;
  // Oracle calls made (each k at most once); equals history.size().
  size_t probes = 0;
  // Every oracle answer, in the order asked. An oracle error is not part of the history.
  std::vector<Probe> history;
  // Every good probe above some bad probe, in increasing good_k; empty when the observed answers
  // are monotone. Only a strategy that probes many points (LinearStrategy with scan_all) can be
  // relied on to find them.
  std::vector<MonotonicityViolation> violations;
  // The oracle's error message, verbatim; empty when the search completed.
  std::string error;
  // The k whose probe failed; nullopt when the search completed.
  std::optional<size_t> error_k;

  bool ok() const { return !error_k.has_value(); }
  bool monotonic() const { return violations.empty(); }
  // The recorded answer for k (true = bad), or nullopt when k was not probed. AnswerFor(n) says
  // whether the failure reproduced with every layer optimized, when the strategy probed it.
  std::optional<bool> AnswerFor(size_t k) const;
};

// Decides which configuration to probe next. Search() calls Reset(n) once, then alternates Next()
// and Record() until Next() returns nullopt. A strategy may propose a k that was already answered;
// Search() then replays the recorded answer without calling the oracle.
class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string_view name() const = 0;
  virtual void Reset(size_t n) = 0;
  // The next k in [1, n] to probe, or nullopt when the strategy has seen enough.
  virtual std::optional<size_t> Next() = 0;
  virtual void Record(size_t k, bool bad) = 0;
};

// Binary search. Probes k = n first (the failure must reproduce with everything optimized), then
// halves the interval between the largest known-good k (initially 0, the reference run) and the
// smallest known-bad k. At most ceil(log2(n)) + 1 probes.
class BisectStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "bisect"; }
  void Reset(size_t n) override;
  std::optional<size_t> Next() override;
  void Record(size_t k, bool bad) override;

 private:
  size_t n_ = 0;
  size_t good_ = 0;  // largest k known good
  size_t bad_ = 0;   // smallest k known bad (valid once checked_n_)
  bool checked_n_ = false;
  bool done_ = false;
};

struct LinearOptions {
  // false (default): scan k = 1, 2, ... and stop at the first bad probe (at most n probes).
  // true: probe every k in [1, n], so that monotonicity violations are found and listed.
  bool scan_all = false;
};

// Scans k in increasing order. Costs up to n probes; use it to check the monotonicity that
// BisectStrategy relies on.
class LinearStrategy final : public Strategy {
 public:
  LinearStrategy() = default;
  explicit LinearStrategy(LinearOptions options) : options_(options) {}

  std::string_view name() const override { return "linear"; }
  void Reset(size_t n) override;
  std::optional<size_t> Next() override;
  void Record(size_t k, bool bad) override;

 private:
  LinearOptions options_;
  size_t n_ = 0;
  size_t next_ = 1;
  bool found_ = false;
};

// Runs `strategy` over configurations [1, n] (n = number of layers) with `oracle`. n = 0 makes no
// probe and reports no bad layer. Never throws (oracle exceptions become `error`). A strategy that
// proposes a k outside [1, n], or keeps proposing answered k, ends the search with an error.
SearchResult Search(Strategy& strategy, size_t n, const Oracle& oracle);

}  // namespace bisect
}  // namespace capsule

#endif  // CAPSULE_BISECT_SEARCH_H_
