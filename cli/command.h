// What every subcommand of `capsule` shares: one file each (keygen_command.h/.cc, ...), each with
// an options struct, a Setup function that declares its flags on a CLI11 app, and a Run function
// that does the work through the libraries and returns the exit status; and the options that
// several of them declare alike (trust, --force, --plugin). Internal to the CLI.
#ifndef CAPSULE_CLI_COMMAND_H_
#define CAPSULE_CLI_COMMAND_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace capsule::cli {

// Setup functions register the subcommand and set `*run` to the action to take when it is chosen.
using RunFn = std::function<int()>;

// What a command does with the capsules it reads, which decides the trust it asks of them
// (cli/capsule.md, "Trust"). A capsule is trusted when a --pubkey key signed it and the makers of
// every capsule it was made from trusted theirs (format/derivation.h).
enum class CapsuleUse {
  // Shows what a capsule holds (inspect, report), with its trust stated: read whoever signed it;
  // unsigned only with --allow-unsigned; with --pubkey, only a trusted one unless
  // --allow-untrusted.
  kShow,
  // Acts on a capsule's content (replay, diff, triage, gate, stress, extract, minimize, redact):
  // only a trusted one, unless --allow-untrusted (--allow-unsigned for an unsigned one) says to
  // go on anyway. What such a command concludes, or writes, is worth the trust of what it read.
  kAct,
};

struct TrustOptions {
  std::vector<std::string> pubkeys;
  bool allow_untrusted = false;  // use capsules no --pubkey key vouches for
  bool allow_unsigned = false;   // ... unsigned ones too (implies allow_untrusted)
  // Set by AddTrustOptions: the command's name, for messages, and its use of capsules.
  std::string command;
  CapsuleUse use = CapsuleUse::kAct;
};

// Declares --pubkey (repeatable, must exist), --allow-untrusted and --allow-unsigned, the trust
// options of every subcommand that reads a capsule except verify, and records `use`.
void AddTrustOptions(CLI::App* cmd, TrustOptions* trust, CapsuleUse use);

// A finite number >= 0; says so with the value given ("--atol: -1 is not a number >= 0"), where
// CLI::NonNegativeNumber would print the largest double.
CLI::Validator NonNegativeNumber();

// Declares --force: replace an existing regular file at the output path (never anything else,
// and never the command's own input).
void AddForceOption(CLI::App* cmd, bool* force);

// --plugin SO (repeatable): shared libraries registering the models a command re-runs.
void AddPluginOption(CLI::App* cmd, std::vector<std::string>* plugins);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_COMMAND_H_
