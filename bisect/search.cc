#include "capsule/bisect/search.h"

#include <exception>

namespace capsule {
namespace bisect {
namespace {

// Oracles are user code (model runs that may throw c10::Error or std::bad_alloc); an exception
// must end the search with a message instead of unwinding through the caller's replay.
OracleAnswer CallOracle(const Oracle& oracle, size_t k) {
  try {
    return oracle(k);
  } catch (const std::exception& e) {
    return OracleAnswer::Error(e.what());
  } catch (...) {
    return OracleAnswer::Error("oracle threw a non-standard exception");
  }
}

enum Answer : signed char { kUnknown = -1, kGood = 0, kBad = 1 };

}  // namespace

OracleAnswer OracleAnswer::Error(std::string message) {
  if (message.empty()) message = "oracle failed without a message";
  return OracleAnswer(Kind::kError, std::move(message));
}

std::optional<bool> SearchResult::AnswerFor(size_t k) const {
  for (const Probe& p : history) {
    if (p.k == k) return p.bad;
  }
  return std::nullopt;
}

void BisectStrategy::Reset(size_t n) {
  n_ = n;
  good_ = 0;
  bad_ = n;
  checked_n_ = false;
  done_ = n == 0;
}

std::optional<size_t> BisectStrategy::Next() {
  if (done_) return std::nullopt;
  if (!checked_n_) return n_;
  if (bad_ - good_ <= 1) return std::nullopt;
  // Rounding the midpoint down keeps the worst case at ceil(log2(n)) halvings: the larger of the
  // two halves is ceil(width / 2).
  return good_ + (bad_ - good_) / 2;
}

void BisectStrategy::Record(size_t k, bool bad) {
  if (!checked_n_ && k == n_) {
    checked_n_ = true;
    // Nothing reproduces with every layer optimized: under monotonicity no prefix is bad either.
    if (!bad) done_ = true;
    return;
  }
  if (bad) {
    if (k < bad_) bad_ = k;
  } else {
    if (k > good_) good_ = k;
  }
  // A good answer at or above a known bad k is a monotonicity violation; the interval is empty and
  // the last transition seen stands.
  if (good_ >= bad_) done_ = true;
}

void LinearStrategy::Reset(size_t n) {
  n_ = n;
  next_ = 1;
  found_ = false;
}

std::optional<size_t> LinearStrategy::Next() {
  if (next_ > n_) return std::nullopt;
  if (found_ && !options_.scan_all) return std::nullopt;
  return next_;
}

void LinearStrategy::Record(size_t k, bool bad) {
  if (bad) found_ = true;
  if (k >= next_) next_ = k + 1;
}

SearchResult Search(Strategy& strategy, size_t n, const Oracle& oracle) {
  SearchResult result;
  strategy.Reset(n);
  if (n == 0) return result;

  std::vector<Answer> answers(n + 1, kUnknown);
  // A correct strategy never needs more than one proposal per k; the cap turns a strategy bug that
  // keeps re-proposing answered k into an error instead of a hang.
  const size_t max_proposals = 2 * n + 2;
  size_t proposals = 0;
  for (std::optional<size_t> next = strategy.Next(); next; next = strategy.Next()) {
    const size_t k = *next;
    std::string name(strategy.name());
    if (k == 0 || k > n) {
      result.error = name + " strategy proposed k=" + std::to_string(k) + " outside [1, " +
                     std::to_string(n) + "]";
      result.error_k = k;
      break;
    }
    if (++proposals > max_proposals) {
      result.error =
          name + " strategy did not converge after " + std::to_string(max_proposals) + " proposals";
      result.error_k = k;
      break;
    }
    if (answers[k] != kUnknown) {
      strategy.Record(k, answers[k] == kBad);
      continue;
    }
    OracleAnswer r = CallOracle(oracle, k);
    if (!r.ok()) {
      result.error = r.error();
      result.error_k = k;
      break;
    }
    answers[k] = r.bad() ? kBad : kGood;
    result.history.push_back({k, r.bad()});
    ++result.probes;
    strategy.Record(k, r.bad());
  }

  std::optional<size_t> last_bad;
  for (size_t k = 1; k <= n; ++k) {
    if (answers[k] == kBad) {
      if (!last_bad && result.ok()) result.first_bad = k - 1;
      last_bad = k;
    } else if (answers[k] == kGood && last_bad) {
      result.violations.push_back({*last_bad, k});
    }
  }
  return result;
}

}  // namespace bisect
}  // namespace capsule
