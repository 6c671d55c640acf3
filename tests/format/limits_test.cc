// The reader's resource limits (FORMAT.md §6 checks 11–18, ReadOptions and ContentLimits in
// format/capsule_reader.h): one test per limit at and just over it, the wire pass against
// protobuf's own parser, and what opening the worst capsules we can build costs in memory and
// time, measured in a child process from getrusage(RUSAGE_SELF).ru_maxrss.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>

#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/wire_limits.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/format/capsule_test_util.h"

namespace capsule::test {
namespace {

// AddressSanitizer's shadow memory and quarantine multiply what an allocation costs in RSS, so
// the memory bounds below hold only in a plain build; under a sanitizer the cases still run (and
// must be answered correctly), their cost is printed, not bounded.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssIsMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRssIsMeaningful = false;
#else
constexpr bool kRssIsMeaningful = true;
#endif
#else
constexpr bool kRssIsMeaningful = true;
#endif

using internal::CheckWireLimits;
using internal::WireCounts;

// ---- Wire-format spelling ---------------------------------------------------------------------

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
std::string Tag(uint32_t field, uint32_t wire) { return Varint(uint64_t{field} << 3 | wire); }
std::string Len(uint32_t field, std::string_view bytes) {
  return Tag(field, 2) + Varint(bytes.size()) + std::string(bytes);
}

std::string MinimalWire() { return SerializeDeterministic(MakeMinimalCapsule()); }

// One zstd frame of `prefix` followed by `filler_size` copies of `filler`, compressed in 1 MiB
// pieces: a 900 MiB payload is built without holding 900 MiB.
std::string StreamFrame(std::string_view prefix, char filler, uint64_t filler_size) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 1);
  ZSTD_CCtx_setPledgedSrcSize(cctx, prefix.size() + filler_size);
  const std::string chunk(size_t{1} << 20, filler);
  std::string out;
  std::string buf(ZSTD_CStreamOutSize(), '\0');
  auto feed = [&](std::string_view data, ZSTD_EndDirective mode) {
    ZSTD_inBuffer in{data.data(), data.size(), 0};
    bool done = false;
    while (!done) {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      const size_t left = ZSTD_compressStream2(cctx, &o, &in, mode);
      if (ZSTD_isError(left)) ADD_FAILURE() << ZSTD_getErrorName(left);
      out.append(buf.data(), o.pos);
      done = mode == ZSTD_e_end ? left == 0 : in.pos == in.size;
    }
  };
  feed(prefix, filler_size == 0 ? ZSTD_e_end : ZSTD_e_continue);
  for (uint64_t done = 0; done < filler_size;) {
    const uint64_t n = std::min<uint64_t>(chunk.size(), filler_size - done);
    done += n;
    feed(std::string_view(chunk).substr(0, n), done == filler_size ? ZSTD_e_end : ZSTD_e_continue);
  }
  ZSTD_freeCCtx(cctx);
  return out;
}

// What getrusage says one call costs, measured in a forked child so the test runner's own peak
// does not hide it.
struct Cost {
  long peak_rss_growth_kb = 0;
  double seconds = 0;
  int code = -1;
};

Cost Measure(const std::function<Status()>& f) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    struct rusage before {
    }, after{};
    ::getrusage(RUSAGE_SELF, &before);
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = f();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    ::getrusage(RUSAGE_SELF, &after);
    const Cost c{after.ru_maxrss - before.ru_maxrss, dt.count(), static_cast<int>(s.code())};
    const ssize_t n = ::write(fds[1], &c, sizeof(c));
    ::_exit(n == sizeof(c) ? 0 : 1);
  }
  ::close(fds[1]);
  Cost c;
  const ssize_t n = ::read(fds[0], &c, sizeof(c));
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  if (n != sizeof(c)) ADD_FAILURE() << "the measuring child died";
  return c;
}

class LimitsTest : public CapsuleBytesTest {
 protected:
  // `wire` as the payload of a capsule signed with key_, whatever its content.
  std::string Sealed(std::string_view wire) const {
    RawHeader h;
    h.uncompressed_size = wire.size();
    return BuildEnvelope(h, OrDie(internal::ZstdCompress(wire, internal::CompressOptions())),
                         &key_);
  }
  std::string SealedFrame(std::string_view frame, uint64_t uncompressed) const {
    RawHeader h;
    h.uncompressed_size = uncompressed;
    return BuildEnvelope(h, frame, &key_);
  }
  // Strict() with small content limits, so a test reaches each one with a few bytes.
  ReadOptions Small() const {
    ReadOptions o = Strict();
    o.limits.max_unknown_field_bytes = 100;
    o.limits.max_messages = 10;
    o.limits.max_repeated_strings = 10;
    o.limits.max_repeated_numbers = 10;
    o.limits.max_string_bytes = 10;
    return o;
  }
  Cost Open(const std::string& bytes, const ReadOptions& o) const {
    return Measure([&] { return DecodeCapsule(bytes, o).status(); });
  }
  static void Report(const char* what, size_t file_bytes, const Cost& c) {
    std::cout << "[ cost     ] " << what << ": " << file_bytes << " byte file, peak RSS +"
              << c.peak_rss_growth_kb / 1024 << " MiB, " << c.seconds * 1000 << " ms, "
              << StatusCodeName(static_cast<StatusCode>(c.code)) << "\n";
  }
};

// ---- Unknown fields -----------------------------------------------------------------------------

TEST_F(LimitsTest, UnknownFieldsUpToTheLimitAreRead) {
  // 2 bytes of tag, 1 of length and 97 of value: exactly 100.
  const std::string wire = MinimalWire() + Len(100, std::string(97, 'x'));
  StatusOr<DecodedCapsule> d = DecodeCapsule(Sealed(wire), Small());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->capsule->GetReflection()->GetUnknownFields(*d->capsule).empty());
}

TEST_F(LimitsTest, UnknownFieldsOverTheLimitAreRefused) {
  EXPECT_TRUE(
      HasError(DecodeCapsule(Sealed(MinimalWire() + Len(100, std::string(98, 'x'))), Small()),
               StatusCode::kResourceExhausted,
               "payload holds 101 bytes of fields this reader does not know, over the "
               "limit of 100"));
}

TEST_F(LimitsTest, UnknownFieldsCountAtEveryDepth) {
  // Inside data.sequences[0], and a known field number with the wrong wire type.
  const std::string seq = Len(1, "id") + Len(100, std::string(60, 's'));  // 63 unknown bytes
  const std::string wire = MinimalWire() + Len(6, Len(1, seq)) + Tag(1, 0) +
                           Varint(7) +                          // writer_version as a varint: 2
                           Tag(100, 5) + std::string(4, 'f') +  // 6
                           Len(101, std::string(30, 't'));      // 33
  WireCounts counts;
  EXPECT_TRUE(HasError(CheckWireLimits(wire, Small().limits, &counts),
                       StatusCode::kResourceExhausted, "fields this reader does not know"));
  EXPECT_EQ(counts.unknown_field_bytes, 63u + 2 + 6 + 33);
  // The defaults read it.
  EXPECT_TRUE(DecodeCapsule(Sealed(wire), Strict()).ok());
}

TEST_F(LimitsTest, UnknownGroupsAreSkippedWhole) {
  // Wire type 3/4 (proto2 groups): no proto3 writer emits them, protobuf keeps them.
  const std::string group = Tag(100, 3) + Tag(1, 0) + Varint(5) + Tag(100, 4);
  WireCounts counts;
  ASSERT_TRUE(CheckWireLimits(MinimalWire() + group, ContentLimits(), &counts).ok());
  EXPECT_EQ(counts.unknown_field_bytes, group.size());
  v1::Capsule parsed;
  EXPECT_TRUE(parsed.ParseFromString(MinimalWire() + group));
  std::string deep;
  for (int i = 0; i < 65; ++i) deep += Tag(100, 3);
  for (int i = 0; i < 65; ++i) deep += Tag(100, 4);
  EXPECT_TRUE(HasError(CheckWireLimits(MinimalWire() + deep, ContentLimits()),
                       StatusCode::kResourceExhausted, "nested more than 64 deep"));
}

// ---- Counts
// ---------------------------------------------------------------------------------------

TEST_F(LimitsTest, MessagesOverTheLimitAreRefused) {
  std::string wire = MinimalWire();
  // Trigger and step, then LogRecord log eight times (merged into one by protobuf): ten messages.
  for (int i = 0; i < 8; ++i) wire += Len(13, "");
  EXPECT_TRUE(DecodeCapsule(Sealed(wire), Small()).ok());
  EXPECT_TRUE(HasError(DecodeCapsule(Sealed(wire + Len(13, "")), Small()),
                       StatusCode::kResourceExhausted,
                       "payload holds 11 messages, over the limit of 10"));
}

TEST_F(LimitsTest, RepeatedStringsOverTheLimitAreRefused) {
  std::string lines;
  for (int i = 0; i < 11; ++i) lines += Len(1, "x");  // LogRecord.lines
  EXPECT_TRUE(HasError(DecodeCapsule(Sealed(MinimalWire() + Len(13, lines)), Small()),
                       StatusCode::kResourceExhausted,
                       "payload holds 11 repeated strings, over the limit of 10"));
}

TEST_F(LimitsTest, RepeatedNumbersPackedOrNotAreCountedAlike) {
  // Sequence.token_ids (field 2): 6 packed and 5 one by one.
  std::string seq = Len(2, std::string("\x01\x02\x03\x04\x05\x06", 6));
  for (int i = 0; i < 5; ++i) seq += Tag(2, 0) + Varint(300);
  WireCounts counts;
  const std::string wire = MinimalWire() + Len(6, Len(1, seq));
  EXPECT_TRUE(HasError(CheckWireLimits(wire, Small().limits, &counts),
                       StatusCode::kResourceExhausted,
                       "payload holds 11 repeated numbers, over the limit of 10"));
  EXPECT_EQ(counts.repeated_numbers, 11u);
  v1::Capsule parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.data().sequences(0).token_ids_size(), 11);
}

TEST_F(LimitsTest, LongStringsAreRefused) {
  EXPECT_TRUE(DecodeCapsule(Sealed(MinimalWire() + Len(3, std::string(10, 'r'))), Small()).ok());
  EXPECT_TRUE(HasError(DecodeCapsule(Sealed(MinimalWire() + Len(3, std::string(11, 'r'))), Small()),
                       StatusCode::kResourceExhausted,
                       "payload holds a string of 11 bytes (capsule.v1.Capsule.run_name), over "
                       "the limit of 10"));
  // Bytes fields are bounded by the payload only.
  std::string rng = Len(1, "g") + Tag(2, 0) + Varint(3) + Len(5, std::string(1000, '\x07'));
  EXPECT_TRUE(DecodeCapsule(Sealed(MinimalWire() + Len(8, Len(1, rng))), Small()).ok());
}

TEST_F(LimitsTest, CountsMatchWhatProtobufBuilds) {
  // Walks the parsed full capsule by reflection and counts what the wire pass should have.
  const v1::Capsule c = MakeFullCapsule();
  uint64_t messages = 0, strings = 0, numbers = 0;
  std::function<void(const google::protobuf::Message&)> walk =
      [&](const google::protobuf::Message& m) {
        using google::protobuf::FieldDescriptor;
        std::vector<const FieldDescriptor*> fields;
        m.GetReflection()->ListFields(m, &fields);
        for (const FieldDescriptor* f : fields) {
          const int n = f->is_repeated() ? m.GetReflection()->FieldSize(m, f) : 1;
          if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
            messages += n;
            for (int i = 0; i < n; ++i) {
              walk(f->is_repeated() ? m.GetReflection()->GetRepeatedMessage(m, f, i)
                                    : m.GetReflection()->GetMessage(m, f));
            }
          } else if (f->is_repeated()) {
            (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING ? strings : numbers) += n;
          }
        }
      };
  walk(c);
  WireCounts counts;
  ASSERT_TRUE(CheckWireLimits(SerializeDeterministic(c), ContentLimits(), &counts).ok());
  EXPECT_EQ(counts.messages, messages);
  EXPECT_EQ(counts.repeated_strings, strings);
  EXPECT_EQ(counts.repeated_numbers, numbers);
  EXPECT_EQ(counts.unknown_field_bytes, 0u);
  EXPECT_GT(messages, 20u);
  EXPECT_GT(numbers, 10u);
}

TEST_F(LimitsTest, MalformedWireIsDataLossAndProtobufAgrees) {
  const std::string base = MinimalWire();
  for (const std::string& bad : {
           base + Tag(100, 2) + Varint(50) + "short",              // length past the end
           base + Tag(100, 6) + "x",                               // wire type 6
           base + Tag(100, 7),                                     // wire type 7
           base + Tag(0, 0) + Varint(1),                           // field number 0
           base + Tag(100, 4),                                     // end group without a start
           base + Tag(100, 3) + Tag(101, 4),                       // end group of another field
           base + Tag(100, 3),                                     // group never ended
           base + Tag(100, 0) + std::string(11, '\xff'),           // varint of 11 bytes
           base + Tag(100, 1) + "1234567",                         // fixed64 cut short
           base + Len(6, Len(1, Len(2, std::string("\x81", 1)))),  // packed varint cut short
           base + Len(13, Tag(100, 2) + Varint(9)),                // inside a message
       }) {
    EXPECT_TRUE(HasError(CheckWireLimits(bad, ContentLimits()), StatusCode::kDataLoss,
                         "corrupt payload (not a capsule.v1.Capsule message)"));
    v1::Capsule parsed;
    EXPECT_FALSE(parsed.ParseFromString(bad)) << "protobuf parses what the wire pass refused";
    EXPECT_TRUE(HasError(DecodeCapsule(Sealed(bad), Strict()), StatusCode::kDataLoss,
                         "not a capsule.v1.Capsule message"));
  }
}

// The wire pass over `wire` as the reader runs it: through one window of `piece` bytes, reused
// (and scribbled over) for each next piece, so a header cut by a window's end must be kept by the
// scanner, never read again from the window.
Status ScanThroughWindow(std::string_view wire, const ContentLimits& limits, size_t piece,
                         WireCounts* counts) {
  internal::WireScanner scanner(limits, wire.size());
  std::string window(piece, '\0');
  Status s;
  for (size_t begin = 0; s.ok() && begin < wire.size(); begin += piece) {
    std::fill(window.begin(), window.end(), '\xee');
    const size_t n = std::min(piece, wire.size() - begin);
    std::copy_n(wire.data() + begin, n, window.begin());
    s = scanner.Advance(window.data(), begin, begin + n);
  }
  if (wire.empty()) s = scanner.Advance(window.data(), 0, 0);
  if (s.ok()) s = scanner.Finish();
  *counts = scanner.counts();
  return s;
}

TEST_F(LimitsTest, TheWirePassGivesOneVerdictWhateverTheWindow) {
  const std::string base = MinimalWire();
  std::string lines;
  for (int i = 0; i < 11; ++i) lines += Len(1, "x");
  const std::string packed = Len(6, Len(1, Len(2, std::string(40, '\x01') + "\x81\x01")));
  // A tag and a length of several bytes each, so windows cut headers at every offset.
  const std::string wide = Tag(100000, 2) + Varint(300) + std::string(300, 'w');
  const std::string cases[] = {
      SerializeDeterministic(MakeFullCapsule()),
      base,
      base + wide + packed + wide,
      base + Len(13, lines),
      base + Len(100, std::string(98, 'x')),
      base + Len(3, std::string(11, 'r')),
      base + Tag(100, 3) + Tag(1, 0) + Varint(5) + wide + Tag(100, 4),
      base + Tag(100, 2) + Varint(50) + "short",
      base + Tag(100, 0) + std::string(11, '\xff'),
      base + Len(6, Len(1, Len(2, std::string("\x81", 1)))),
      base + Len(13, Tag(100, 2) + Varint(9)),
  };
  for (const std::string& wire : cases) {
    WireCounts whole_counts;
    const Status whole = CheckWireLimits(wire, Small().limits, &whole_counts);
    for (size_t piece :
         {size_t{1}, size_t{2}, size_t{7}, size_t{14}, size_t{15}, size_t{16}, size_t{4096}}) {
      WireCounts counts;
      const Status windowed = ScanThroughWindow(wire, Small().limits, piece, &counts);
      EXPECT_EQ(windowed.code(), whole.code()) << piece << ": " << windowed << " vs " << whole;
      EXPECT_EQ(windowed.message(), whole.message()) << piece;
      EXPECT_EQ(counts.unknown_field_bytes, whole_counts.unknown_field_bytes) << piece;
      EXPECT_EQ(counts.messages, whole_counts.messages) << piece;
      EXPECT_EQ(counts.repeated_strings, whole_counts.repeated_strings) << piece;
      EXPECT_EQ(counts.repeated_numbers, whole_counts.repeated_numbers) << piece;
    }
  }
}

// The reader decompresses, scans and parses a window at a time, so protobuf may refuse bytes
// before the rest is decompressed; the codes still come in FORMAT.md's order. A string that is
// not UTF-8 (protobuf refuses it; the wire pass counts only lengths) in the first window, then
// over a window of padding, a limit broken or a zstd checksum that fails: those are reported.
TEST_F(LimitsTest, ALaterLimitOrChecksumOutranksAnEarlierParseFailure) {
  const std::string not_utf8 = Len(3, std::string("\xc0\x80", 2));
  const std::string padding = Len(
      8, Len(1, Len(1, "pad") + Tag(2, 0) + Varint(3) + Len(5, Incompressible(size_t{3} << 20))));
  v1::Capsule parsed;
  ASSERT_FALSE(parsed.ParseFromString(MinimalWire() + not_utf8));
  EXPECT_TRUE(HasError(DecodeCapsule(Sealed(MinimalWire() + not_utf8 + padding), Strict()),
                       StatusCode::kDataLoss, "not a capsule.v1.Capsule message"));
  EXPECT_TRUE(HasError(
      DecodeCapsule(Sealed(MinimalWire() + not_utf8 + padding + Len(100, std::string(98, 'x'))),
                    Small()),
      StatusCode::kResourceExhausted, "fields this reader does not know"));
  const std::string wire = MinimalWire() + not_utf8 + padding;
  std::string frame = OrDie(internal::ZstdCompress(wire, internal::CompressOptions()));
  frame.back() = static_cast<char>(frame.back() ^ 1);  // the content checksum
  EXPECT_TRUE(HasError(DecodeCapsule(SealedFrame(frame, wire.size()), Strict()),
                       StatusCode::kDataLoss, "corrupt payload: zstd"));
}

TEST_F(LimitsTest, TheWriterRefusesWhatTheReaderWould) {
  v1::Capsule c = MakeMinimalCapsule();
  c.mutable_log()->add_lines(std::string((size_t{16} << 20) + 1, 'l'));
  EXPECT_TRUE(HasError(EncodeCapsule(c, WriteOptions()), StatusCode::kResourceExhausted,
                       "refusing to write a capsule readers refuse: payload holds a string of "
                       "16777217 bytes (capsule.v1.LogRecord.lines)"));
}

// ---- zstd frame parameters
// ------------------------------------------------------------------------

// `frame` (single-segment, as the writer makes small ones) re-headed as a frame with a window
// descriptor of 2^window_log and, when non-zero, a one-byte dictionary id.
std::string Reheaded(const std::string& frame, int window_log, uint8_t dict_id) {
  const auto* u = reinterpret_cast<const unsigned char*>(frame.data());
  const unsigned fhd = u[4];
  const bool single = (fhd & 0x20) != 0;
  const unsigned fcs_flag = fhd >> 6;
  static constexpr size_t kDidBytes[] = {0, 1, 2, 4};
  static constexpr size_t kFcsBytes[] = {0, 2, 4, 8};
  const size_t did = kDidBytes[fhd & 3];
  const size_t fcs = fcs_flag == 0 ? (single ? 1 : 0) : kFcsBytes[fcs_flag];
  const size_t header = 5 + (single ? 0 : 1) + did + fcs;
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  std::string out = frame.substr(0, 4);
  out.push_back(static_cast<char>((2u << 6) | (fhd & 0x04) | (dict_id != 0 ? 1 : 0)));
  out.push_back(static_cast<char>((window_log - 10) << 3));
  if (dict_id != 0) out.push_back(static_cast<char>(dict_id));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(content >> (8 * i)));
  return out + frame.substr(header);
}

TEST_F(LimitsTest, ZstdWindowOverTheDefaultLimitIsRefused) {
  // Stock `zstd -d` refuses a window over 128 MiB without --memory; so does the reader.
  const std::string wire = MinimalWire();
  const std::string frame = OrDie(internal::ZstdCompress(wire, internal::CompressOptions()));
  ASSERT_TRUE(DecodeCapsule(SealedFrame(Reheaded(frame, 27, 0), wire.size()), Strict()).ok());
  EXPECT_TRUE(HasError(DecodeCapsule(SealedFrame(Reheaded(frame, 28, 0), wire.size()), Strict()),
                       StatusCode::kResourceExhausted,
                       "zstd frame needs a window of 268435456 bytes, over the limit of "
                       "134217728"));
}

TEST_F(LimitsTest, ZstdDictionaryIsRefused) {
  const std::string wire = MinimalWire();
  const std::string frame = OrDie(internal::ZstdCompress(wire, internal::CompressOptions()));
  EXPECT_TRUE(HasError(DecodeCapsule(SealedFrame(Reheaded(frame, 20, 7), wire.size()), Strict()),
                       StatusCode::kDataLoss, "zstd frame needs dictionary 7; capsules use none"));
}

// ---- Compression ratio, and what the worst capsules cost ---------------------------------------

constexpr uint64_t kBombBytes = uint64_t{900} << 20;

std::string BombWire(uint64_t filler) {
  return MinimalWire() + Tag(100, 2) + Varint(filler);  // then `filler` bytes of the field
}

// BombWire(*filler) with the filler chosen so that the whole payload is `total` bytes.
std::string BombWireOfTotal(uint64_t total, uint64_t* filler) {
  *filler = total - MinimalWire().size() - 2 - Varint(total).size();
  const std::string prefix = BombWire(*filler);
  *filler = total - prefix.size();  // the same unless the varint got shorter
  return BombWire(*filler);
}

TEST_F(LimitsTest, CompressionRatioGuardWhenAsked) {
  ReadOptions o = Strict();
  EXPECT_EQ(o.max_compression_ratio, 0u) << "off by default: legitimate capsules reach 30,000:1";
  o.max_compression_ratio = 128;
  // At the ratio-free size, any ratio; above it, at most 128:1.
  uint64_t filler = 0;
  const std::string prefix = BombWireOfTotal(o.ratio_free_bytes, &filler);
  ASSERT_EQ(prefix.size() + filler, o.ratio_free_bytes);
  const std::string at = SealedFrame(StreamFrame(prefix, 'a', filler), o.ratio_free_bytes);
  o.limits.max_unknown_field_bytes = o.ratio_free_bytes;
  EXPECT_TRUE(DecodeCapsule(at, o).ok()) << DecodeCapsule(at, o).status();
  const std::string over_prefix = BombWireOfTotal(o.ratio_free_bytes + 1, &filler);
  ASSERT_EQ(over_prefix.size() + filler, o.ratio_free_bytes + 1);
  const std::string over =
      SealedFrame(StreamFrame(over_prefix, 'a', filler), o.ratio_free_bytes + 1);
  EXPECT_TRUE(HasError(DecodeCapsule(over, o), StatusCode::kResourceExhausted,
                       "a compression ratio over the limit of 128:1"));
  o.max_compression_ratio = 0;
  EXPECT_TRUE(DecodeCapsule(over, o).ok());
}

TEST_F(LimitsTest, A900MiBBombCostsNothing) {
  // A signed capsule of about 30 KB holding a 900 MiB unknown field used to cost `verify` 7.8 s
  // and 2.0 GB. The field's tag and length arrive in the first megabyte decompressed, and the
  // capsule is refused there.
  const std::string prefix = BombWire(kBombBytes);
  const std::string bomb =
      SealedFrame(StreamFrame(prefix, 'S', kBombBytes), prefix.size() + kBombBytes);
  EXPECT_LT(bomb.size(), 64u * 1024);
  const Cost c = Open(bomb, Strict());
  Report("900 MiB unknown-field bomb", bomb.size(), c);
  EXPECT_EQ(c.code, static_cast<int>(StatusCode::kResourceExhausted));
  if (kRssIsMeaningful) {
    EXPECT_LT(c.peak_rss_growth_kb, 16 * 1024);  // one step of decompression, zstd's window
  }
  // (The time it takes is printed, not asserted: timings belong in bench/.)
  RecordProperty("bomb_rss_kb", static_cast<int>(c.peak_rss_growth_kb));
}

// `wire` plus an RNG state of noise a hundredth of its size: a file that would pass even a 128:1
// ratio guard.
std::string Padded(const std::string& wire) {
  const std::string rng =
      Len(1, "pad") + Tag(2, 0) + Varint(3) + Len(5, Incompressible(wire.size() / 100));
  return wire + Len(8, Len(1, rng));
}

TEST_F(LimitsTest, WorstCasesUnderTheLimitsCostASmallMultipleOfTheirSize) {
  // What a stranger can make a reader build without breaking a limit: each case sits at one
  // limit, in a file that would pass even a 128:1 ratio guard. The bounds are the ones FORMAT.md
  // §6 states (they include protobuf's and malloc's growth of repeated fields by doubling).
  const ReadOptions o = Strict();
  struct Case {
    const char* what;
    std::string bytes;
    long max_rss_mib;
  };
  std::vector<Case> cases;
  {  // 1 MiB of unknown field, the most there may be.
    uint64_t filler = 0;
    const std::string prefix =
        BombWireOfTotal(o.limits.max_unknown_field_bytes + MinimalWire().size(), &filler);
    cases.push_back({"1 MiB unknown field",
                     SealedFrame(StreamFrame(prefix, 'u', filler), prefix.size() + filler), 8});
  }
  {  // 2^18 messages: 2^17 layers, each with its stats, all valid.
    const std::string layer = Len(1, Tag(3, 0) + Varint(1) + Len(5, Tag(11, 0) + Varint(~0ull)));
    std::string layers;
    // With numerics, trigger, step and the padding's two: 2 * (2^17 - 3) + 5 = 2^18 - 1.
    for (uint64_t i = 0; i < o.limits.max_messages / 2 - 3; ++i) layers += layer;
    cases.push_back({"2^18 messages", Sealed(Padded(MinimalWire() + Len(9, layers))), 48});
  }
  {  // 2^18 log lines of one byte.
    std::string lines;
    for (uint64_t i = 0; i < o.limits.max_repeated_strings; ++i) lines += Len(1, "x");
    cases.push_back({"2^18 strings", Sealed(Padded(MinimalWire() + Len(13, lines))), 48});
  }
  {  // 2^22 packed token ids of one byte each.
    const uint64_t n = o.limits.max_repeated_numbers;
    const uint64_t seq = 1 + Varint(n).size() + n;
    const uint64_t batch = 1 + Varint(seq).size() + seq;
    const std::string wire = MinimalWire() + Tag(6, 2) + Varint(batch) + Tag(1, 2) + Varint(seq) +
                             Tag(2, 2) + Varint(n) + std::string(n, '\0');
    cases.push_back({"2^22 numbers", Sealed(Padded(wire)), 128});
  }
  {  // One 16 MiB string: a sample's raw text.
    const std::string seq = Len(6, std::string(o.limits.max_string_bytes, 'r'));
    cases.push_back({"16 MiB string", Sealed(Padded(MinimalWire() + Len(6, Len(1, seq)))), 64});
  }
  for (const Case& k : cases) {
    const Cost c = Open(k.bytes, o);
    Report(k.what, k.bytes.size(), c);
    EXPECT_EQ(c.code, static_cast<int>(StatusCode::kOk)) << k.what;
    if (kRssIsMeaningful) {
      EXPECT_LT(c.peak_rss_growth_kb / 1024, k.max_rss_mib) << k.what;
    }
  }
}

}  // namespace
}  // namespace capsule::test
