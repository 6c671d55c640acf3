// SpikeRule: when a loss or gradient norm is a spike rather than noise.
//
// Training curves are noisy on a multiplicative scale (a batch twice as hard doubles the loss; an
// Adam step can double the gradient norm), and they drift while the model learns. The rule works
// on logarithms of the last `window` finite, positive values: a value spikes when
//
//   log(value) > median(log window) + max(mads * 1.4826 * MAD(log window), log(min_ratio))
//
// i.e. it is at least `min_ratio` times the running median AND `mads` robust standard deviations
// above it, and only once `warmup` values exist (the fast early drop of the loss is not a
// baseline). README ("Triggers") gives the false-trigger and detection rates that chose the
// defaults, and bench/trigger_rates.py measures them again.
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
  int window = 50;         // values the median and MAD are taken over (most recent first)
  int warmup = 50;         // no threshold before this many finite, positive values exist
  double mads = 6.0;       // robust standard deviations (1.4826 * MAD) of log values
  double min_ratio = 2.0;  // and at least this multiple of the running median
};

// The smallest value that spikes, in the values' own units; nullopt until the rule has `warmup`
// finite positive values among `recent` (oldest first; only the last `window` are used). Values
// that are non-finite or not positive are skipped: the rule is for positive quantities.
std::optional<double> SpikeThreshold(const std::vector<double>& recent, const SpikeRule& rule);

// "> 2x median(last 50) and 6*1.4826*MAD of log values, after 50 steps": the rule as recorded in
// a capsule's trigger.
std::string DescribeSpikeRule(const SpikeRule& rule);

}  // namespace capsule

#endif  // CAPSULE_CAPTURE_SPIKE_RULE_H_
