// proto/FORMAT.md against the code and the golden files it describes: the §9 dump and field table
// are regenerated from samples/golden/valid/minimal.capsule, the §6.1 limits from the ReadOptions
// and ContentLimits defaults (§6.3's from CheckpointLimits), and §6's checks are numbered 1 to 20
// in order. A change to either side that the other does not follow fails here.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "capsule/checkpoint/checkpoint_index.h"
#include "capsule/format/capsule_reader.h"

namespace capsule::test {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// `xxd -g2` without the text column: "00000000: 8943 5053 ...".
std::string Dump(const std::string& bytes) {
  std::string out;
  char buf[32];
  for (size_t i = 0; i < bytes.size(); i += 16) {
    std::snprintf(buf, sizeof(buf), "%08zx:", i);
    out += buf;
    for (size_t j = i; j < bytes.size() && j < i + 16; j += 2) {
      out += ' ';
      for (size_t k = j; k < j + 2 && k < bytes.size(); ++k) {
        std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(bytes[k]));
        out += buf;
      }
    }
    out += '\n';
  }
  return out;
}

std::string Hex(const std::string& bytes, size_t at, size_t n) {
  std::string out;
  char buf[4];
  for (size_t i = at; i < at + n && i < bytes.size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%s%02x", i == at ? "" : " ",
                  static_cast<unsigned char>(bytes[i]));
    out += buf;
  }
  return out;
}

std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> cells;
  size_t at = row.find('|');
  while (at != std::string::npos) {
    const size_t next = row.find('|', at + 1);
    if (next == std::string::npos) break;
    std::string cell = row.substr(at + 1, next - at - 1);
    const size_t b = cell.find_first_not_of(' ');
    const size_t e = cell.find_last_not_of(' ');
    cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
    at = next;
  }
  return cells;
}

class FormatDocTest : public ::testing::Test {
 protected:
  FormatDocTest()
      : doc_(Lines(ReadText(std::string(CAPSULE_SOURCE_DIR) + "/proto/FORMAT.md"))),
        golden_(
            ReadText(std::string(CAPSULE_SOURCE_DIR) + "/samples/golden/valid/minimal.capsule")) {}
  // Index of the first line equal to `text`, or doc_.size().
  size_t Find(const std::string& text, size_t from = 0) const {
    for (size_t i = from; i < doc_.size(); ++i) {
      if (doc_[i] == text) return i;
    }
    return doc_.size();
  }
  std::vector<std::string> doc_;
  std::string golden_;
};

TEST_F(FormatDocTest, WorkedExampleDumpIsTheGoldenFile) {
  ASSERT_EQ(golden_.size(), 295u);
  const size_t marker = Find("<!-- generated: xxd -g2 of samples/golden/valid/minimal.capsule -->");
  ASSERT_LT(marker + 1, doc_.size()) << "FORMAT.md §9 lost its dump marker";
  ASSERT_EQ(doc_[marker + 1], "```text");
  std::string dump;
  size_t i = marker + 2;
  for (; i < doc_.size() && doc_[i] != "```"; ++i) dump += doc_[i] + "\n";
  EXPECT_EQ(dump, Dump(golden_)) << "regenerate the §9 dump from the golden file";
}

TEST_F(FormatDocTest, WorkedExampleTableTilesTheGoldenFile) {
  const size_t marker = Find("<!-- generated: xxd -g2 of samples/golden/valid/minimal.capsule -->");
  ASSERT_LT(marker, doc_.size());
  size_t expected_offset = 0;
  int rows = 0;
  for (size_t i = marker; i < doc_.size(); ++i) {
    if (doc_[i].rfind("| 0x", 0) != 0) continue;
    const std::vector<std::string> c = Cells(doc_[i]);
    ASSERT_EQ(c.size(), 5u) << doc_[i];
    const size_t offset = std::stoul(c[0], nullptr, 16);
    const size_t size = std::stoul(c[1]);
    EXPECT_EQ(offset, expected_offset) << "rows must tile the file: " << doc_[i];
    const std::string bytes = Hex(golden_, offset, std::min<size_t>(size, 8));
    const std::string shown = size > 8 ? "`" + bytes + " …`" : "`" + bytes + "`";
    EXPECT_EQ(c[3], shown) << doc_[i];
    expected_offset = offset + size;
    ++rows;
  }
  EXPECT_GT(rows, 20);
  EXPECT_EQ(expected_offset, golden_.size());
}

TEST_F(FormatDocTest, ReadingChecksAreNumberedOneToTwentyOne) {
  const size_t heading = Find("## 6. Reading: cheapest check first, fail closed");
  ASSERT_LT(heading, doc_.size());
  int expected = 1;
  for (size_t i = heading; i < doc_.size() && doc_[i].rfind("### ", 0) != 0; ++i) {
    const std::vector<std::string> c = Cells(doc_[i]);
    if (c.size() != 3 || c[0].empty() || !std::isdigit(static_cast<unsigned char>(c[0][0]))) {
      continue;
    }
    EXPECT_EQ(c[0], std::to_string(expected)) << doc_[i];
    ++expected;
  }
  EXPECT_EQ(expected, 22);
}

TEST_F(FormatDocTest, LimitsTableStatesTheDefaults) {
  const ReadOptions r;
  const ContentLimits& l = r.limits;
  const CheckpointLimits k;  // §6.3
  const std::pair<const char*, uint64_t> defaults[] = {
      {"`ReadOptions::max_file_bytes`", r.max_file_bytes},
      {"`ReadOptions::max_uncompressed_bytes`", r.max_uncompressed_bytes},
      {"`ReadOptions::max_compression_ratio`", r.max_compression_ratio},
      {"`ContentLimits::max_unknown_field_bytes`", l.max_unknown_field_bytes},
      {"`ContentLimits::max_messages`", l.max_messages},
      {"`ContentLimits::max_repeated_strings`", l.max_repeated_strings},
      {"`ContentLimits::max_repeated_numbers`", l.max_repeated_numbers},
      {"`ContentLimits::max_string_bytes`", l.max_string_bytes},
      {"`CheckpointLimits::max_file_bytes`", k.max_file_bytes},
      {"`CheckpointLimits::max_pickle_bytes`", k.max_pickle_bytes},
      {"`CheckpointLimits::max_zip_entries`", k.max_zip_entries},
      {"`CheckpointLimits::max_values`", k.max_values},
      {"`CheckpointLimits::max_stack`", k.max_stack},
      {"`CheckpointLimits::max_marks`", k.max_marks},
      {"`CheckpointLimits::max_module_depth`", static_cast<uint64_t>(k.max_module_depth)},
  };
  for (const auto& [name, value] : defaults) {
    bool found = false;
    for (const std::string& line : doc_) {
      const std::vector<std::string> c = Cells(line);
      if (c.size() == 3 && c[0] == name) {
        found = true;
        EXPECT_EQ(c[1].substr(0, c[1].find(' ')), std::to_string(value)) << line;
      }
    }
    EXPECT_TRUE(found) << name << " is missing from FORMAT.md §6.1 or §6.3";
  }
}

}  // namespace
}  // namespace capsule::test
