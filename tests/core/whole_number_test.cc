// Whole numbers of settings: digits only, within a bound, errno untouched.
#include "core/whole_number.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <limits>
#include <string>

#include "testing/scoped_env.h"

namespace distribute::internal {
namespace {

TEST(WholeNumberTest, DigitsOnlyUpToTheBound) {
  EXPECT_EQ(parse_whole_number("0"), 0u);
  EXPECT_EQ(parse_whole_number("007"), 7u);
  EXPECT_EQ(parse_whole_number("18446744073709551615"), std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(parse_whole_number("2147483647", 2147483647u), 2147483647u);
  EXPECT_EQ(parse_whole_number("2147483648", 2147483647u), std::nullopt);
  for (const char* bad : {"", "-1", "+5", " 5", "5 ", "1e3", "2G", "0x10", "18446744073709551616", "abc"}) {
    EXPECT_EQ(parse_whole_number(bad), std::nullopt) << "'" << bad << "'";
  }
  EXPECT_EQ(parse_whole_number(nullptr), std::nullopt);
}

TEST(WholeNumberTest, LeavesErrnoAsItWas) {
  errno = EINTR;
  EXPECT_EQ(parse_whole_number("99999999999999999999999"), std::nullopt);  // strtoull's ERANGE
  EXPECT_EQ(errno, EINTR);
}

TEST(WholeNumberTest, SettingsNameThemselvesWhenBad) {
  const char* kName = "DISTRIBUTE_TEST_WHOLE_NUMBER";
  const distribute::testing::ScopedEnv env(kName, nullptr);
  EXPECT_EQ(env_whole_number(kName, "a count"), std::nullopt);
  env.set("");
  EXPECT_EQ(env_whole_number(kName, "a count"), std::nullopt);
  env.set("12");
  EXPECT_EQ(env_whole_number(kName, "a count", 12), 12u);
  env.set("13");
  try {
    env_whole_number(kName, "a count", 12);
    ADD_FAILURE() << "13 accepted above 12";
  } catch (const InvalidArgumentError& e) {
    EXPECT_EQ(std::string(e.what()).find("DISTRIBUTE_TEST_WHOLE_NUMBER='13' is not a count up to 12"), 0u) << e.what();
  }
  env.set("1k");
  try {
    env_whole_number(kName, "a count");
    ADD_FAILURE() << "1k accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_EQ(std::string(e.what()).find("DISTRIBUTE_TEST_WHOLE_NUMBER='1k' is not a count"), 0u) << e.what();
    EXPECT_EQ(std::string(e.what()).find("up to"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distribute::internal
