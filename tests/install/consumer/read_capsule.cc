// Reads a capsule trusting one public key, and prints its Markdown report's first line.
//   read_capsule FILE KEY.pub
#include <iostream>

#include "capsule/format/capsule_reader.h"
#include "capsule/format/signing.h"
#include "capsule/report/report.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: read_capsule FILE KEY.pub\n";
    return 2;
  }
  auto key = capsule::LoadPublicKeyFile(argv[2]);
  if (!key.ok()) {
    std::cerr << key.status() << "\n";
    return 2;
  }
  capsule::ReadOptions options;
  options.trusted_keys.push_back(*key);
  auto decoded = capsule::ReadCapsuleFile(argv[1], options);
  if (!decoded.ok()) {
    std::cerr << decoded.status() << "\n";
    return 1;
  }
  capsule::ReportOptions report;
  report.file_name = argv[1];
  const std::string md = capsule::RenderMarkdown(
      capsule::BuildReportModel(*decoded->capsule, decoded->envelope, nullptr, report));
  std::cout << md.substr(0, md.find('\n')) << "\n";
  return 0;
}
