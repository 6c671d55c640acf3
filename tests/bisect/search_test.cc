#include "capsule/bisect/search.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace capsule {
namespace bisect {
namespace {

size_t CeilLog2(size_t n) {
  size_t bits = 0;
  while ((size_t{1} << bits) < n) ++bits;
  return bits;
}

// An oracle over an explicit bad/good table (index k, entry 0 unused) that fails the test when a
// k is asked twice or lies outside [1, n].
class TableOracle {
 public:
  explicit TableOracle(std::vector<bool> bad) : bad_(std::move(bad)) {}

  // Monotone table for first bad layer `first_bad` (nullopt: no bad layer).
  static TableOracle Monotone(size_t n, std::optional<size_t> first_bad) {
    std::vector<bool> bad(n + 1, false);
    for (size_t k = 1; k <= n; ++k) bad[k] = first_bad && k > *first_bad;
    return TableOracle(std::move(bad));
  }

  Oracle AsOracle() {
    return [this](size_t k) {
      EXPECT_GE(k, 1u);
      EXPECT_LT(k, bad_.size());
      EXPECT_TRUE(asked_.insert(k).second) << "k=" << k << " probed twice";
      if (k == 0 || k >= bad_.size()) return OracleAnswer::Error("out of range");
      return OracleAnswer::FromBool(bad_[k]);
    };
  }

  size_t calls() const { return asked_.size(); }

 private:
  std::vector<bool> bad_;
  std::set<size_t> asked_;
};

std::string Describe(size_t n, std::optional<size_t> first_bad) {
  return "n=" + std::to_string(n) +
         " first_bad=" + (first_bad ? std::to_string(*first_bad) : "none");
}

TEST(BisectStrategyTest, FindsEveryFirstBadLayerWithinLogBound) {
  BisectStrategy strategy;  // reused across searches on purpose: Reset must clear all state
  for (size_t n = 1; n <= 64; ++n) {
    std::vector<std::optional<size_t>> cases = {std::nullopt};
    for (size_t b = 0; b < n; ++b) cases.push_back(b);
    for (std::optional<size_t> first_bad : cases) {
      SCOPED_TRACE(Describe(n, first_bad));
      TableOracle table = TableOracle::Monotone(n, first_bad);
      SearchResult r = Search(strategy, n, table.AsOracle());
      ASSERT_TRUE(r.ok()) << r.error;
      EXPECT_EQ(r.first_bad, first_bad);
      EXPECT_LE(r.probes, CeilLog2(n) + 1);
      EXPECT_EQ(r.probes, table.calls());
      EXPECT_EQ(r.history.size(), r.probes);
      EXPECT_TRUE(r.monotonic());
      // The reproduction check comes first.
      ASSERT_FALSE(r.history.empty());
      EXPECT_EQ(r.history.front().k, n);
      EXPECT_EQ(r.AnswerFor(n), std::optional<bool>(first_bad.has_value()));
      if (!first_bad) {
        EXPECT_EQ(r.probes, 1u);
      }
    }
  }
}

TEST(LinearStrategyTest, AgreesWithBisectOnMonotoneOracles) {
  BisectStrategy bisect;
  LinearStrategy linear;
  LinearStrategy scan_all(LinearOptions{/*scan_all=*/true});
  for (size_t n = 1; n <= 64; ++n) {
    std::vector<std::optional<size_t>> cases = {std::nullopt};
    for (size_t b = 0; b < n; ++b) cases.push_back(b);
    for (std::optional<size_t> first_bad : cases) {
      SCOPED_TRACE(Describe(n, first_bad));
      TableOracle t1 = TableOracle::Monotone(n, first_bad);
      TableOracle t2 = TableOracle::Monotone(n, first_bad);
      TableOracle t3 = TableOracle::Monotone(n, first_bad);
      SearchResult b = Search(bisect, n, t1.AsOracle());
      SearchResult l = Search(linear, n, t2.AsOracle());
      SearchResult a = Search(scan_all, n, t3.AsOracle());
      ASSERT_TRUE(b.ok() && l.ok() && a.ok());
      EXPECT_EQ(l.first_bad, b.first_bad);
      EXPECT_EQ(a.first_bad, b.first_bad);
      // Stop-at-first probes 1..first_bad+1; scan_all probes everything.
      EXPECT_EQ(l.probes, first_bad ? *first_bad + 1 : n);
      EXPECT_EQ(a.probes, n);
      for (size_t i = 0; i < l.history.size(); ++i) EXPECT_EQ(l.history[i].k, i + 1);
      EXPECT_TRUE(l.monotonic());
      EXPECT_TRUE(a.monotonic());
    }
  }
}

TEST(SearchTest, ZeroLayersMakesNoProbe) {
  BisectStrategy bisect;
  LinearStrategy linear;
  for (Strategy* s : std::vector<Strategy*>{&bisect, &linear}) {
    SearchResult r = Search(*s, 0, [](size_t) -> OracleAnswer {
      ADD_FAILURE() << "oracle called for n=0";
      return OracleAnswer::Good();
    });
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r.probes, 0u);
    EXPECT_FALSE(r.first_bad.has_value());
  }
}

TEST(SearchTest, OracleErrorStopsAndPropagates) {
  for (size_t fail_at : {1u, 5u, 8u}) {
    BisectStrategy bisect;
    LinearStrategy linear(LinearOptions{true});
    for (Strategy* s : std::vector<Strategy*>{&bisect, &linear}) {
      SCOPED_TRACE(std::string(s->name()) + " fail_at=" + std::to_string(fail_at));
      size_t calls = 0;
      bool failed = false;
      SearchResult r = Search(*s, 8, [&](size_t k) {
        EXPECT_FALSE(failed) << "oracle called again after it failed";
        ++calls;
        if (k == fail_at) {
          failed = true;
          return OracleAnswer::Error("composite run k=" + std::to_string(k) + ": out of memory");
        }
        return OracleAnswer::FromBool(k > 2);
      });
      if (!failed) continue;  // this strategy never asked for fail_at
      EXPECT_FALSE(r.ok());
      EXPECT_EQ(r.error, "composite run k=" + std::to_string(fail_at) + ": out of memory");
      EXPECT_EQ(r.error_k, std::optional<size_t>(fail_at));
      EXPECT_FALSE(r.first_bad.has_value());
      EXPECT_EQ(r.probes, calls - 1);  // the failed call is not an answer
      EXPECT_FALSE(r.AnswerFor(fail_at).has_value());
    }
  }
}

TEST(SearchTest, OracleExceptionBecomesError) {
  BisectStrategy bisect;
  SearchResult r = Search(bisect, 4, [](size_t k) -> OracleAnswer {
    if (k == 4) return OracleAnswer::Bad();
    throw std::runtime_error("layer blocks.1 threw");
  });
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error, "layer blocks.1 threw");
  EXPECT_EQ(r.error_k, std::optional<size_t>(2));
  EXPECT_EQ(r.probes, 1u);

  SearchResult odd = Search(bisect, 4, [](size_t) -> OracleAnswer { throw 42; });
  EXPECT_FALSE(odd.ok());
  EXPECT_NE(odd.error.find("exception"), std::string::npos);

  SearchResult empty = Search(bisect, 4, Oracle());
  EXPECT_FALSE(empty.ok());
  EXPECT_FALSE(empty.error.empty());
}

TEST(SearchTest, EmptyErrorMessageIsReplaced) {
  LinearStrategy linear;
  SearchResult r = Search(linear, 3, [](size_t) { return OracleAnswer::Error(""); });
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.error.empty());
}

TEST(LinearStrategyTest, ScanAllReportsMonotonicityViolations) {
  // Layers 3..6 optimized are bad, but optimizing layer 4 too (k=5) masks it again.
  //            k:  -  1  2  3  4  5  6  7
  TableOracle t({false, false, false, true, true, false, false, true});
  LinearStrategy scan_all(LinearOptions{true});
  SearchResult r = Search(scan_all, 7, t.AsOracle());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.probes, 7u);
  EXPECT_EQ(r.first_bad, std::optional<size_t>(2));
  EXPECT_FALSE(r.monotonic());
  ASSERT_EQ(r.violations.size(), 2u);
  EXPECT_EQ(r.violations[0].bad_k, 4u);
  EXPECT_EQ(r.violations[0].good_k, 5u);
  EXPECT_EQ(r.violations[1].bad_k, 4u);
  EXPECT_EQ(r.violations[1].good_k, 6u);

  // Stop-at-first sees only the prefix and cannot tell.
  TableOracle t2({false, false, false, true, true, false, false, true});
  LinearStrategy linear;
  SearchResult first = Search(linear, 7, t2.AsOracle());
  EXPECT_EQ(first.first_bad, std::optional<size_t>(2));
  EXPECT_EQ(first.probes, 3u);
  EXPECT_TRUE(first.monotonic());
}

// Every bad/good pattern for small n: the search terminates within its bound, never repeats a k,
// and what it reports is consistent with what it saw.
TEST(SearchTest, ArbitraryOraclesStayConsistent) {
  for (size_t n = 1; n <= 10; ++n) {
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      std::vector<bool> bad(n + 1, false);
      for (size_t k = 1; k <= n; ++k) bad[k] = (mask >> (k - 1)) & 1u;
      SCOPED_TRACE("n=" + std::to_string(n) + " mask=" + std::to_string(mask));

      TableOracle tb(bad);
      BisectStrategy bisect;
      SearchResult b = Search(bisect, n, tb.AsOracle());
      ASSERT_TRUE(b.ok());
      EXPECT_LE(b.probes, CeilLog2(n) + 1);
      if (!bad[n]) {
        EXPECT_FALSE(b.first_bad.has_value());
      } else {
        // Bisect ends on a real good-to-bad transition: k bad, k-1 the reference or probed good.
        ASSERT_TRUE(b.first_bad.has_value());
        const size_t k = *b.first_bad + 1;
        EXPECT_TRUE(bad[k]);
        if (k > 1) {
          EXPECT_EQ(b.AnswerFor(k - 1), std::optional<bool>(false));
        }
      }

      TableOracle ta(bad);
      LinearStrategy scan_all(LinearOptions{true});
      SearchResult a = Search(scan_all, n, ta.AsOracle());
      ASSERT_TRUE(a.ok());
      EXPECT_EQ(a.probes, n);
      std::optional<size_t> smallest_bad;
      std::vector<std::pair<size_t, size_t>> expected_violations;
      std::optional<size_t> last_bad;
      for (size_t k = 1; k <= n; ++k) {
        if (bad[k]) {
          if (!smallest_bad) smallest_bad = k;
          last_bad = k;
        } else if (last_bad) {
          expected_violations.emplace_back(*last_bad, k);
        }
      }
      EXPECT_EQ(a.first_bad,
                smallest_bad ? std::optional<size_t>(*smallest_bad - 1) : std::nullopt);
      ASSERT_EQ(a.violations.size(), expected_violations.size());
      for (size_t i = 0; i < expected_violations.size(); ++i) {
        EXPECT_EQ(a.violations[i].bad_k, expected_violations[i].first);
        EXPECT_EQ(a.violations[i].good_k, expected_violations[i].second);
      }
    }
  }
}

// A strategy that keeps proposing the same k: Search answers from its cache and gives up with an
// error instead of spinning or asking the oracle again.
class StuckStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "stuck"; }
  void Reset(size_t) override {}
  std::optional<size_t> Next() override { return 2; }
  void Record(size_t, bool) override {}
};

class OutOfRangeStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "out-of-range"; }
  void Reset(size_t n) override { n_ = n; }
  std::optional<size_t> Next() override { return n_ + 1; }
  void Record(size_t, bool) override {}

 private:
  size_t n_ = 0;
};

TEST(SearchTest, MisbehavingStrategiesEndWithAnError) {
  StuckStrategy stuck;
  TableOracle t = TableOracle::Monotone(4, 1);
  SearchResult r = Search(stuck, 4, t.AsOracle());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("did not converge"), std::string::npos) << r.error;
  EXPECT_EQ(t.calls(), 1u);
  EXPECT_EQ(r.probes, 1u);

  OutOfRangeStrategy oor;
  SearchResult r2 = Search(oor, 4, [](size_t) -> OracleAnswer {
    ADD_FAILURE() << "oracle called for an out-of-range k";
    return OracleAnswer::Good();
  });
  EXPECT_FALSE(r2.ok());
  EXPECT_EQ(r2.error, "out-of-range strategy proposed k=5 outside [1, 4]");
}

TEST(SearchTest, BisectAtThirtyTwoLayersUsesSixProbes) {
  BisectStrategy bisect;
  LinearStrategy linear;
  TableOracle tb = TableOracle::Monotone(32, 31);
  TableOracle tl = TableOracle::Monotone(32, 31);
  EXPECT_EQ(Search(bisect, 32, tb.AsOracle()).probes, 6u);
  EXPECT_EQ(Search(linear, 32, tl.AsOracle()).probes, 32u);
}

}  // namespace
}  // namespace bisect
}  // namespace capsule
