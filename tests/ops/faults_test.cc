#include "ops/faults.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "ops/errors.h"

namespace gradfuzz::ops {
namespace {

using ::testing::HasSubstr;

TEST(Faults, EveryFaultIsOffByDefault) {
  for (Fault fault : all_faults()) EXPECT_FALSE(fault_enabled(fault)) << fault_name(fault);
}

TEST(Faults, NamesAreUniqueKebabCaseAndRoundTrip) {
  std::set<std::string> names;
  for (Fault fault : all_faults()) {
    const std::string name = fault_name(fault);
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz-"), std::string::npos) << name;
    EXPECT_EQ(fault_from_name(name), fault);
  }
  // six review defects, two section 11 hazards, a stale plan, three process kills, one OOB,
  // four that exist only in half precision
  EXPECT_EQ(names.size(), 17u);
  for (Fault fault : all_faults()) {
    EXPECT_FALSE(fault_description(fault).empty()) << fault_name(fault);
    EXPECT_EQ(fault_is_half_precision(fault), fault_name(fault).rfind("half-", 0) == 0) << fault_name(fault);
  }
  EXPECT_EQ(fault_shapes(Fault::kHalfAccumulation), "edge");
  EXPECT_EQ(fault_shapes(Fault::kHalfOutputScale), "");
  EXPECT_EQ(fault_name(Fault::kCrashSegfault), "crash-segfault");
  EXPECT_EQ(fault_name(Fault::kSlotOrder), "slot-order");
  EXPECT_EQ(fault_name(Fault::kInternalRequiresGrad), "internal-requires-grad");
}

TEST(Faults, UnknownNameThrowsAndListsKnownFaults) {
  try {
    fault_from_name("slot-orders");
    FAIL() << "unknown fault accepted";
  } catch (const UnknownNameError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown-name"));
    EXPECT_THAT(e.what(), HasSubstr("'slot-orders'"));
    EXPECT_THAT(e.what(), HasSubstr("slot-order"));
    EXPECT_THAT(e.what(), HasSubstr("transient-lock"));
  }
}

TEST(Faults, ScopeSwitchesOnAndRestoresPreviousState) {
  EXPECT_FALSE(fault_enabled(Fault::kTransientLock));
  {
    FaultScope outer(Fault::kTransientLock);
    EXPECT_TRUE(fault_enabled(Fault::kTransientLock));
    EXPECT_FALSE(fault_enabled(Fault::kSlotOrder));  // faults are independent
    {
      FaultScope inner(Fault::kTransientLock, false);
      EXPECT_FALSE(fault_enabled(Fault::kTransientLock));
    }
    EXPECT_TRUE(fault_enabled(Fault::kTransientLock));
  }
  EXPECT_FALSE(fault_enabled(Fault::kTransientLock));
}

}  // namespace
}  // namespace gradfuzz::ops
