// The payload codec (proto/internal/zstd_codec.h) and the decompression-bomb guard: a frame that
// declares far more than the cap is refused before anything of that size is allocated.
#include "capsule/format/internal/zstd_codec.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "capsule/format/capsule_reader.h"
#include "tests/format/capsule_test_util.h"

namespace capsule::test {
namespace {

constexpr uint64_t kHundredGb = 100'000'000'000ull;

// A frame header that pledges `pledged` bytes, followed by one flushed block of a few KiB and no
// end: the shape of a bomb, without spending the CPU to produce 100 GB.
std::string PledgedFrame(uint64_t pledged) {
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_contentSizeFlag, 1);
  if (ZSTD_isError(ZSTD_CCtx_setPledgedSrcSize(cctx.get(), pledged))) return "";
  const std::string chunk(4096, 'a');
  std::string out(ZSTD_compressBound(chunk.size()) + 64, '\0');
  ZSTD_inBuffer in{chunk.data(), chunk.size(), 0};
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  const size_t rc = ZSTD_compressStream2(cctx.get(), &o, &in, ZSTD_e_flush);
  if (ZSTD_isError(rc) || rc != 0) return "";
  out.resize(o.pos);
  return out;
}

// A complete, well-formed frame declaring `content` bytes, written by hand: one RLE block per
// 128 KiB (4 bytes each), so 100 GB costs 3 MB and no compression time. The checksum is zero;
// nothing here should get as far as decompressing it.
std::string RleFrame(uint64_t content) {
  std::string f("\x28\xb5\x2f\xfd", 4);
  f += static_cast<char>(0xc4);  // 8-byte content size, not single-segment, checksum flag
  f += static_cast<char>(0x38);  // window 2^(10+7) = 128 KiB
  for (int i = 0; i < 8; ++i) f += static_cast<char>(content >> (8 * i));
  constexpr uint64_t kBlock = 128 * 1024;
  f.reserve(f.size() + (content / kBlock + 1) * 4 + 4);
  for (uint64_t left = content; left > 0;) {
    const uint64_t n = std::min(left, kBlock);
    left -= n;
    const uint32_t h = (left == 0 ? 1u : 0u) | (1u << 1) | static_cast<uint32_t>(n << 3);
    f += static_cast<char>(h);
    f += static_cast<char>(h >> 8);
    f += static_cast<char>(h >> 16);
    f += 'z';
  }
  f.append(4, '\0');
  return f;
}

long MaxRssKb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

TEST(ZstdCodecTest, RoundTrip) {
  const std::string data = SerializeDeterministic(MakeFullCapsule());
  StatusOr<std::string> frame = internal::ZstdCompress(data, internal::CompressOptions());
  ASSERT_TRUE(frame.ok()) << frame.status();
  StatusOr<internal::FrameInfo> info = internal::ZstdFrameInfo(*frame);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->content_size, data.size());
  EXPECT_TRUE(info->has_checksum);
  EXPECT_EQ(info->compressed_size, frame->size());
  StatusOr<std::string> back = internal::ZstdDecompress(*frame, data.size(), data.size());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, data);
}

TEST(ZstdCodecTest, EmptyInput) {
  StatusOr<std::string> frame = internal::ZstdCompress("", internal::CompressOptions());
  ASSERT_TRUE(frame.ok());
  StatusOr<std::string> back = internal::ZstdDecompress(*frame, 0, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, "");
}

TEST(ZstdCodecTest, BadLevelIsInvalidArgument) {
  internal::CompressOptions o;
  o.level = 1000;
  // zstd clamps levels above the maximum; a level it rejects outright must surface as an error,
  // never as a frame without a checksum.
  StatusOr<std::string> frame = internal::ZstdCompress("abc", o);
  if (frame.ok()) {
    StatusOr<internal::FrameInfo> info = internal::ZstdFrameInfo(*frame);
    ASSERT_TRUE(info.ok());
    EXPECT_TRUE(info->has_checksum);
  } else {
    EXPECT_EQ(frame.status().code(), StatusCode::kInvalidArgument) << frame.status();
  }
}

// `data` through a ZstdFrameWriter in pieces of `piece` bytes, the frame collected from its sink.
std::string StreamedFrame(std::string_view data, size_t piece, const internal::CompressOptions& o) {
  std::string frame;
  auto writer = OrDie(internal::ZstdFrameWriter::Start(data.size(), o, [&](std::string_view p) {
    EXPECT_LE(p.size(), ZSTD_CStreamOutSize());
    frame.append(p);
    return Status::Ok();
  }));
  for (size_t at = 0; at < data.size(); at += piece) {
    EXPECT_TRUE(writer->Write(data.substr(at, piece)).ok());
  }
  EXPECT_TRUE(writer->Finish().ok());
  return frame;
}

// Repeats and noise in turns, so the frame holds compressed, raw and RLE blocks.
std::string Mixed(size_t n) {
  std::string data;
  while (data.size() < n) {
    data += Incompressible(70000 + data.size() % 9000);
    data += std::string(50000, static_cast<char>(data.size()));
    for (int i = 0; i < 4000; ++i) data += "layer " + std::to_string(i % 97) + " ";
  }
  data.resize(n);
  return data;
}

// The writer streams the frame; the golden samples and every capsule written before were made by
// ZSTD_compress2 of the whole message. Within zstd's window (every golden sample) the bytes must
// not depend on which; past it they may, by a few matches. At any size they must not depend on
// how the input is cut, or encoding would not be deterministic.
TEST(ZstdFrameWriterTest, MakesTheFrameZstdCompressMakesWhateverThePieces) {
  const std::string big = Mixed(size_t{5} << 20);  // a whole number of 128 KiB blocks
  for (int level : {-1, 1, 3}) {
    internal::CompressOptions o;
    o.level = level;
    for (std::string_view data :
         {std::string_view(), std::string_view("abc"), std::string_view(big).substr(0, 131072),
          std::string_view(big).substr(0, 300000), std::string_view(big)}) {
      const std::string first = StreamedFrame(data, std::max<size_t>(data.size(), 1), o);
      if (data.size() <= 300000) {
        EXPECT_TRUE(first == OrDie(internal::ZstdCompress(data, o)))
            << "level " << level << ", " << data.size() << " bytes";
      }
      EXPECT_EQ(OrDie(internal::ZstdDecompress(first, data.size(), data.size())), data);
      for (size_t piece : {size_t{7}, size_t{4096}, size_t{65536}, size_t{1} << 20}) {
        if (piece >= data.size() || (piece < 4096 && data.size() > 300000)) continue;
        EXPECT_TRUE(StreamedFrame(data, piece, o) == first)
            << "level " << level << ", " << data.size() << " bytes in pieces of " << piece;
      }
    }
  }
}

TEST(ZstdFrameWriterTest, RefusesMoreOrFewerBytesThanItDeclared) {
  auto sink = [](std::string_view) { return Status::Ok(); };
  auto more = OrDie(internal::ZstdFrameWriter::Start(3, internal::CompressOptions(), sink));
  EXPECT_TRUE(more->Write("ab").ok());
  EXPECT_TRUE(HasError(more->Write("cd"), StatusCode::kInternal, "more bytes than the frame"));
  auto fewer = OrDie(internal::ZstdFrameWriter::Start(3, internal::CompressOptions(), sink));
  EXPECT_TRUE(fewer->Write("ab").ok());
  EXPECT_TRUE(HasError(fewer->Finish(), StatusCode::kInternal, "fewer bytes than the frame"));
}

TEST(ZstdFrameWriterTest, ASinkErrorStopsTheFrame) {
  auto writer = OrDie(internal::ZstdFrameWriter::Start(
      size_t{1} << 20, internal::CompressOptions(),
      [](std::string_view) { return ResourceExhaustedError("disk full"); }));
  const std::string data = Incompressible(size_t{1} << 20);
  Status s = writer->Write(data);
  if (s.ok()) s = writer->Finish();
  EXPECT_TRUE(HasError(s, StatusCode::kResourceExhausted, "disk full"));
}

TEST(ZstdFrameReaderTest, ReadsAFrameThroughAnyWindow) {
  const std::string data = Mixed(size_t{3} << 20);
  const std::string frame = OrDie(internal::ZstdCompress(data, internal::CompressOptions()));
  for (size_t window : {size_t{1}, size_t{1000}, size_t{131072}, size_t{1} << 20, data.size()}) {
    if (window == 1) {  // a byte at a time: only the first 300 KB
      auto reader = OrDie(internal::ZstdFrameReader::Open(frame, data.size(), data.size()));
      char b = 0;
      for (size_t i = 0; i < 300000; ++i) {
        ASSERT_EQ(OrDie(reader->Read(&b, 1)), 1u);
        ASSERT_EQ(b, data[i]) << i;
      }
      continue;
    }
    auto reader = OrDie(internal::ZstdFrameReader::Open(frame, data.size(), data.size()));
    std::string back, buffer(window, '\0');
    while (!reader->done()) {
      const size_t n = OrDie(reader->Read(buffer.data(), buffer.size()));
      ASSERT_TRUE(n == buffer.size() || reader->done()) << "a short read before the end";
      back.append(buffer.data(), n);
    }
    EXPECT_EQ(back, data) << window;
    EXPECT_EQ(reader->produced(), data.size());
    EXPECT_EQ(OrDie(reader->Read(buffer.data(), buffer.size())), 0u);
  }
}

TEST(ZstdFrameReaderTest, RefusesWhatZstdDecompressRefuses) {
  const std::string data = Incompressible(200000);
  std::string frame = OrDie(internal::ZstdCompress(data, internal::CompressOptions()));
  EXPECT_TRUE(HasError(internal::ZstdFrameReader::Open(frame, data.size() - 1, data.size()),
                       StatusCode::kDataLoss, "zstd frame declares 200000 bytes"));
  EXPECT_TRUE(HasError(internal::ZstdFrameReader::Open(frame, data.size(), data.size() - 1),
                       StatusCode::kResourceExhausted, "over the limit"));
  frame.back() = static_cast<char>(frame.back() ^ 1);  // the content checksum
  auto reader = OrDie(internal::ZstdFrameReader::Open(frame, data.size(), data.size()));
  std::string buffer(65536, '\0');
  Status s;
  while (s.ok() && !reader->done()) s = reader->Read(buffer.data(), buffer.size()).status();
  EXPECT_TRUE(HasError(s, StatusCode::kDataLoss, "corrupt payload: zstd"));
}

TEST(ZstdCodecTest, VersionIsReported) { EXPECT_EQ(internal::ZstdVersion(), ZSTD_versionString()); }

TEST(ZstdBombTest, PledgedFrameDeclaresHundredGigabytes) {
  const std::string frame = PledgedFrame(kHundredGb);
  ASSERT_FALSE(frame.empty());
  EXPECT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), kHundredGb);
  EXPECT_LT(frame.size(), 1024u);
}

TEST(ZstdBombTest, ZstdDecompressRefusesOverTheCap) {
  const std::string frame = PledgedFrame(kHundredGb);
  EXPECT_TRUE(HasError(internal::ZstdDecompress(frame, kHundredGb, uint64_t{1} << 30),
                       StatusCode::kResourceExhausted,
                       "payload declares 100000000000 bytes uncompressed, over the limit of "
                       "1073741824"));
}

TEST(ZstdBombTest, RleFrameIsWellFormed) {
  const std::string frame = RleFrame(kHundredGb);
  EXPECT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), kHundredGb);
  EXPECT_EQ(ZSTD_findFrameCompressedSize(frame.data(), frame.size()), frame.size());
  // The same construction at a small size really decompresses (to 'z's), so the big one is a
  // real bomb and not merely malformed.
  const std::string small = RleFrame(300000);
  std::string out(300000, '\0');
  const size_t n = ZSTD_decompress(out.data(), out.size(), small.data(), small.size());
  // The zero checksum is wrong; everything before it decoded.
  EXPECT_TRUE(ZSTD_isError(n));
  EXPECT_EQ(ZSTD_getErrorCode(n), ZSTD_error_checksum_wrong) << ZSTD_getErrorName(n);
  EXPECT_EQ(out, std::string(300000, 'z'));
}

TEST(ZstdBombTest, ZstdDecompressRefusesAHeaderFrameMismatch) {
  // The header (what the cap is checked against) says 1 KiB; the frame says 100 GB.
  EXPECT_TRUE(HasError(internal::ZstdDecompress(RleFrame(kHundredGb), 1024, uint64_t{1} << 30),
                       StatusCode::kDataLoss,
                       "zstd frame declares 100000000000 bytes but the header says 1024"));
  EXPECT_TRUE(HasError(internal::ZstdDecompress(PledgedFrame(kHundredGb), 1024, uint64_t{1} << 30),
                       StatusCode::kDataLoss, "zstd frame"));
}

TEST(ZstdBombTest, ZstdDecompressRefusesAnUnfinishedFrameWithoutAllocating) {
  // Even with no cap, a frame that never ends is found out from its structure, not by
  // allocating what it declares.
  const std::string frame = PledgedFrame(kHundredGb);
  const long before = MaxRssKb();
  EXPECT_TRUE(
      HasError(internal::ZstdDecompress(frame, kHundredGb, std::numeric_limits<uint64_t>::max()),
               StatusCode::kDataLoss, "zstd frame is truncated or malformed"));
  EXPECT_LT(MaxRssKb() - before, 256 * 1024) << "peak RSS grew by more than 256 MiB";
}

class ZstdBombEnvelopeTest : public CapsuleBytesTest {
 protected:
  std::string Sealed(const std::string& frame, uint64_t header_declares) const {
    RawHeader h;
    h.uncompressed_size = header_declares;
    return BuildEnvelope(h, frame, &key_);
  }
};

TEST_F(ZstdBombEnvelopeTest, DecodeCapsuleRefusesBeforeAllocating) {
  const long before = MaxRssKb();
  EXPECT_TRUE(HasError(Decode(Sealed(PledgedFrame(kHundredGb), kHundredGb)),
                       StatusCode::kResourceExhausted,
                       "payload declares 100000000000 bytes uncompressed, over the limit of"));
  EXPECT_TRUE(HasError(Decode(Sealed(RleFrame(kHundredGb), kHundredGb)),
                       StatusCode::kResourceExhausted, "over the limit of"));
  EXPECT_LT(MaxRssKb() - before, 256 * 1024) << "peak RSS grew by more than 256 MiB";
}

TEST_F(ZstdBombEnvelopeTest, SmallerCapsStillRefuse) {
  ReadOptions o = Strict();
  o.max_uncompressed_bytes = 1 << 20;
  EXPECT_TRUE(HasError(DecodeCapsule(Sealed(RleFrame(kHundredGb), kHundredGb), o),
                       StatusCode::kResourceExhausted, "over the limit of 1048576"));
}

TEST_F(ZstdBombEnvelopeTest, HeaderUnderstatingTheFrameIsDataLoss) {
  // A header that claims a small size to pass the cap is caught by the frame's own declaration.
  EXPECT_TRUE(HasError(Decode(Sealed(RleFrame(kHundredGb), 4096)), StatusCode::kDataLoss,
                       "zstd frame declares 100000000000 bytes but the header says 4096"));
  EXPECT_TRUE(HasError(Decode(Sealed(PledgedFrame(kHundredGb), 4096)), StatusCode::kDataLoss,
                       "zstd frame"));
}

TEST_F(ZstdBombEnvelopeTest, HeaderOverstatingTheFrameIsDataLoss) {
  EXPECT_TRUE(HasError(Decode(Sealed(RleFrame(4096), 1 << 20)), StatusCode::kDataLoss,
                       "zstd frame declares 4096 bytes but the header says 1048576"));
}

TEST_F(ZstdBombEnvelopeTest, CompressionRatioGuardRefusesWithTheCapLifted) {
  ReadOptions o = Strict();
  o.max_uncompressed_bytes = std::numeric_limits<uint64_t>::max();
  o.max_compression_ratio = 4096;
  EXPECT_TRUE(HasError(DecodeCapsule(Sealed(RleFrame(kHundredGb), kHundredGb), o),
                       StatusCode::kResourceExhausted,
                       "a compression ratio over the limit of 4096:1 (a decompression bomb?)"));
}

TEST_F(ZstdBombEnvelopeTest, NoCapStillDoesNotAllocate) {
  // With the caller's cap lifted, an unfinished frame is still found out from its structure and
  // a complete one by protobuf's own 2 GiB limit, never by allocating 100 GB.
  ReadOptions o = Strict();
  o.max_uncompressed_bytes = std::numeric_limits<uint64_t>::max();
  const long before = MaxRssKb();
  EXPECT_TRUE(HasError(DecodeCapsule(Sealed(PledgedFrame(kHundredGb), kHundredGb), o),
                       StatusCode::kDataLoss, "truncated or malformed"));
  EXPECT_TRUE(HasError(DecodeCapsule(Sealed(RleFrame(kHundredGb), kHundredGb), o),
                       StatusCode::kResourceExhausted, "2 GiB"));
  EXPECT_LT(MaxRssKb() - before, 256 * 1024) << "peak RSS grew by more than 256 MiB";
}

}  // namespace
}  // namespace capsule::test
