#include "capsule/base/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>

namespace capsule {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s, Status::Ok());
}

TEST(StatusTest, OkCodeDropsTheMessage) {
  // An OK status never carries text: equality and ToString would otherwise disagree.
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s, Status());
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = DataLossError("corrupt payload");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "corrupt payload");
  EXPECT_EQ(s.ToString(), "DATA_LOSS: corrupt payload");
  std::ostringstream os;
  os << s;
  EXPECT_EQ(os.str(), "DATA_LOSS: corrupt payload");
}

TEST(StatusTest, Equality) {
  EXPECT_EQ(NotFoundError("a"), NotFoundError("a"));
  EXPECT_NE(NotFoundError("a"), NotFoundError("b"));
  EXPECT_NE(NotFoundError("a"), InternalError("a"));
}

TEST(StatusTest, FactoriesUseTheirCodes) {
  const std::pair<Status, StatusCode> cases[] = {
      {InvalidArgumentError("m"), StatusCode::kInvalidArgument},
      {NotFoundError("m"), StatusCode::kNotFound},
      {PermissionDeniedError("m"), StatusCode::kPermissionDenied},
      {ResourceExhaustedError("m"), StatusCode::kResourceExhausted},
      {FailedPreconditionError("m"), StatusCode::kFailedPrecondition},
      {OutOfRangeError("m"), StatusCode::kOutOfRange},
      {UnimplementedError("m"), StatusCode::kUnimplemented},
      {InternalError("m"), StatusCode::kInternal},
      {DataLossError("m"), StatusCode::kDataLoss},
      {UnauthenticatedError("m"), StatusCode::kUnauthenticated},
      {UnavailableError("m"), StatusCode::kUnavailable},
  };
  for (const auto& [status, code] : cases) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_EQ(status.message(), "m");
  }
}

TEST(StatusTest, WithContextPrefixesAndKeepsCode) {
  Status s = OutOfRangeError("truncated").WithContext("a.capsule");
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.message(), "a.capsule: truncated");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").ok());
  EXPECT_EQ(Status::Ok().WithContext("ignored").message(), "");
}

TEST(StatusTest, CodeNamesMatchTheCanonicalNumbering) {
  // The numbering is absl's / google.rpc.Code's: tools map exit codes and JSON by these names.
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_EQ(StatusCodeName(StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_EQ(StatusCodeName(StatusCode::kAlreadyExists), "ALREADY_EXISTS");
  EXPECT_EQ(StatusCodeName(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(StatusCodeName(StatusCode::kOutOfRange), "OUT_OF_RANGE");
  EXPECT_EQ(StatusCodeName(StatusCode::kDataLoss), "DATA_LOSS");
  EXPECT_EQ(StatusCodeName(StatusCode::kUnauthenticated), "UNAUTHENTICATED");
  EXPECT_EQ(static_cast<int>(StatusCode::kDataLoss), 15);
  EXPECT_EQ(static_cast<int>(StatusCode::kUnauthenticated), 16);
}

TEST(StatusTest, CodeNameRoundTripsForEveryCode) {
  for (int i = 0; i <= 16; ++i) {
    const auto code = static_cast<StatusCode>(i);
    const std::string_view name = StatusCodeName(code);
    ASSERT_FALSE(name.empty());
    std::optional<StatusCode> back = StatusCodeFromName(name);
    ASSERT_TRUE(back.has_value()) << name;
    EXPECT_EQ(*back, code) << name;
  }
}

TEST(StatusTest, UnknownCodeAndName) {
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(17)), "UNKNOWN");
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(-1)), "UNKNOWN");
  EXPECT_FALSE(StatusCodeFromName("NOT_A_CODE").has_value());
  EXPECT_FALSE(StatusCodeFromName("data_loss").has_value());  // exact spelling only
  EXPECT_FALSE(StatusCodeFromName("").has_value());
}

TEST(StatusTest, ErrnoErrorMapping) {
  const std::pair<int, StatusCode> cases[] = {
      {ENOENT, StatusCode::kNotFound},
      {ENOTDIR, StatusCode::kNotFound},
      {EACCES, StatusCode::kPermissionDenied},
      {EPERM, StatusCode::kPermissionDenied},
      {EROFS, StatusCode::kPermissionDenied},
      {ENOSPC, StatusCode::kResourceExhausted},
      {EDQUOT, StatusCode::kResourceExhausted},
      {EFBIG, StatusCode::kResourceExhausted},
      {EIO, StatusCode::kInternal},
      {EINVAL, StatusCode::kInternal},
  };
  for (const auto& [err, code] : cases) {
    Status s = ErrnoError(err, "cannot open", "/x/y.capsule");
    EXPECT_EQ(s.code(), code) << std::strerror(err);
    EXPECT_EQ(s.message(), std::string("cannot open /x/y.capsule: ") + std::strerror(err));
  }
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError(std::to_string(x) + " is odd");
  return x / 2;
}

TEST(StatusOrTest, ValueAndError) {
  StatusOr<int> v = Half(8);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v.status().ok());
  EXPECT_EQ(*v, 4);
  EXPECT_EQ(v.value(), 4);

  StatusOr<int> e = Half(3);
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), "3 is odd");
}

TEST(StatusOrTest, MoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> p(std::make_unique<int>(5));
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> taken = *std::move(p);
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 5);
}

TEST(StatusOrTest, ArrowAndMutation) {
  StatusOr<std::string> s(std::string("abc"));
  EXPECT_EQ(s->size(), 3u);
  s->append("d");
  EXPECT_EQ(*s, "abcd");
  Status moved = StatusOr<std::string>(NotFoundError("gone")).status();
  EXPECT_EQ(moved.code(), StatusCode::kNotFound);
}

// Reading the value of an error used to dereference an empty std::optional (undefined behaviour,
// garbage or a crash far from the cause); now it stops at once and says which error it was.
TEST(StatusOrDeathTest, ValueOfAnErrorAbortsWithTheStatus) {
  const StatusOr<int> e = Half(3);
  EXPECT_DEATH((void)e.value(), "StatusOr has no value: INVALID_ARGUMENT: 3 is odd");
  EXPECT_DEATH((void)*e, "StatusOr has no value: INVALID_ARGUMENT: 3 is odd");
  StatusOr<std::string> gone(NotFoundError("gone"));
  EXPECT_DEATH((void)gone->size(), "StatusOr has no value: NOT_FOUND: gone");
  EXPECT_DEATH((void)std::move(gone).value(), "NOT_FOUND: gone");
}

TEST(StatusOrTest, OkStatusWithoutValueIsAnError) {
#ifdef NDEBUG
  // Release builds keep going with an internal error instead of an empty "ok" value.
  StatusOr<int> s{Status::Ok()};
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInternal);
#else
  EXPECT_DEATH({ StatusOr<int> s{Status::Ok()}; }, "OK status");
#endif
}

Status ReturnIfError(const Status& inner, int* reached) {
  CAPSULE_RETURN_IF_ERROR(inner);
  ++*reached;
  return Status::Ok();
}

Status ReturnIfErrorOr(int x, int* reached) {
  CAPSULE_RETURN_IF_ERROR(Half(x));
  ++*reached;
  return Status::Ok();
}

TEST(StatusMacrosTest, ReturnIfError) {
  int reached = 0;
  EXPECT_TRUE(ReturnIfError(Status::Ok(), &reached).ok());
  EXPECT_EQ(reached, 1);
  Status s = ReturnIfError(DataLossError("bad"), &reached);
  EXPECT_EQ(s, DataLossError("bad"));
  EXPECT_EQ(reached, 1);

  EXPECT_TRUE(ReturnIfErrorOr(2, &reached).ok());
  EXPECT_EQ(reached, 2);
  EXPECT_EQ(ReturnIfErrorOr(1, &reached).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reached, 2);
}

StatusOr<int> Quarter(int x) {
  // Two expansions in one function: the temporaries must not collide.
  CAPSULE_ASSIGN_OR_RETURN(int half, Half(x));
  CAPSULE_ASSIGN_OR_RETURN(const int quarter, Half(half));
  return quarter;
}

StatusOr<int> Deref(StatusOr<std::unique_ptr<int>> p) {
  CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<int> owned, std::move(p));
  return *owned;
}

TEST(StatusMacrosTest, AssignOrReturn) {
  StatusOr<int> q = Quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);
  EXPECT_EQ(Quarter(6).status(), InvalidArgumentError("3 is odd"));
  EXPECT_EQ(Quarter(5).status(), InvalidArgumentError("5 is odd"));

  StatusOr<int> d = Deref(std::make_unique<int>(9));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, 9);
  EXPECT_EQ(Deref(NotFoundError("none")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace capsule
