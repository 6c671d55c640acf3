// SpikeRule: when a loss or gradient norm is a spike rather than noise or the curve's own descent.
//
// Training curves are noisy on a multiplicative scale (a batch twice as hard doubles the loss; an
// Adam step can double the gradient norm), and they fall while the model learns. The rule works on
// logarithms of the last `window` finite, positive values. With `detrend`, a robust line
// (Theil-Sen: the median of all pairwise slopes, then the median intercept) is fitted through them;
// the level is that line at the step being judged and the spread is 1.4826 * MAD of the residuals,
// so the early descent neither inflates the spread nor holds the level up. Without it, the level is
// the window's median and the spread 1.4826 * MAD of the window. A value spikes when
//
//   log(value) > level + max(mads * spread, log(min_ratio))   and   value > exp(level) + min_rise
//
// i.e. it is at least `min_ratio` times the level, `mads` robust standard deviations above it, and
// (for a loss in nats) `min_rise` nats above it, so that a loss settled near zero does not fire on
// ordinary batches that are many times its level but a few hundredths of a nat. A loss settled
// near zero also bounces multiplicatively (0.01 to 0.5), which widens the log spread to hundreds
// of times the level; `max_rise` bounds that: a value `max_rise` above the level (and above
// `min_ratio` times it) spikes whatever the spread. No threshold before `warmup` values exist.
// README ("Triggers") gives the false-trigger and detection rates that chose the defaults;
// bench/spike_rule_rates.py measures them again. detrend = false with min_rise = max_rise = 0 is
// the plain median/MAD rule.
//
//   capsule::SpikeRule rule;                      // loss defaults
//   std::optional<double> t = capsule::SpikeThreshold(last_values, rule);
//   if (t && value > *t) { ... spike ... }
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_CAPTURE_SPIKE_RULE_H_
#define CAPSULE_CAPTURE_SPIKE_RULE_H_

#include <optional>
#include <string>
#include <vector>

namespace capsule {

struct SpikeRule {
  int window = 50;         // values the level and spread are taken over (most recent first)
  int warmup = 50;         // no threshold before this many finite, positive values exist
  double mads = 6.0;       // robust standard deviations (1.4826 * MAD) of log values (residuals)
  double min_ratio = 2.0;  // and at least this multiple of the level
  bool detrend = true;     // level and spread from a Theil-Sen line through the log values
  double min_rise = 2.0;   // and at least this much above the level, in the values' units: nats
                           // for a loss; 0 (off) for a quantity without a natural unit
  double max_rise = 4.0;   // a value this far above the level spikes whatever the spread; 0: off
};

// The smallest value that spikes, in the values' own units; nullopt until the rule has `warmup`
// finite positive values among `recent` (oldest first; only the last `window` are used). Values
// that are non-finite or not positive are skipped: the rule is for positive quantities.
std::optional<double> SpikeThreshold(const std::vector<double>& recent, const SpikeRule& rule);

// "> 2x and 6*1.4826*MAD above the trend of log values (last 50) or 4 above it, and 2 above it,
// after 50 steps":
// the rule as recorded in a capsule's trigger.
std::string DescribeSpikeRule(const SpikeRule& rule);

}  // namespace capsule

#endif  // CAPSULE_CAPTURE_SPIKE_RULE_H_
