#include "capsule/report/replay_tool.h"

#include "capsule/proto/capsule.pb.h"

namespace capsule {

std::string PubkeyArgument() { return std::string(flags::kPubkey) + " SIGNER.pub"; }

bool WrittenFromPython(const v1::Capsule& capsule) {
  return capsule.environment().libraries().count("python") != 0;
}

ReplayTool ReplayToolFor(const v1::Capsule& capsule) {
  if (WrittenFromPython(capsule)) return {"python3 -P -m capsule", "--model <pkg.module:factory>"};
  return {"capsule", "--plugin <model plugin>"};
}

}  // namespace capsule
