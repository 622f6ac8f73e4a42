#include "worker/host_identity.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr char kId[] = "0123456789abcdef0123456789abcdef";

TEST(ReadMachineIdTest, TakesTheFirstValidFile) {
  testing::TempDir dir;
  testing::WriteFile(dir.File("empty"), "\n");
  testing::WriteFile(dir.File("good"), std::string(kId) + "\n");
  auto id = ReadMachineId({dir.File("missing"), dir.File("empty"), dir.File("good")});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, kId);
}

TEST(ReadMachineIdTest, SaysWhatIsWrongWithEachFile) {
  testing::TempDir dir;
  testing::WriteFile(dir.File("empty"), "");
  testing::WriteFile(dir.File("short"), "abc123\n");
  testing::WriteFile(dir.File("upper"), "0123456789ABCDEF0123456789ABCDEF\n");
  auto id = ReadMachineId(
      {dir.File("missing"), dir.File("empty"), dir.File("short"), dir.File("upper")});
  ASSERT_EQ(id.status().code(), absl::StatusCode::kNotFound);
  const std::string message(id.status().message());
  EXPECT_THAT(message, HasSubstr(dir.File("missing") + ": No such file or directory"));
  EXPECT_THAT(message, HasSubstr(dir.File("empty") + ": empty"));
  EXPECT_THAT(message, HasSubstr(dir.File("short") + ": \"abc123\" is not 32 lowercase hex"));
  EXPECT_THAT(message, HasSubstr(dir.File("upper") + ": \"0123456789ABCDEF"));
}

TEST(InterfaceIpv4AddressTest, LoopbackHasItsAddress) {
  auto address = InterfaceIpv4Address("lo");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1");
}

TEST(InterfaceIpv4AddressTest, AMissingInterfaceListsTheOnesThereAre) {
  auto address = InterfaceIpv4Address("nosuchif0");
  ASSERT_EQ(address.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(address.status().message(), HasSubstr("no network interface \"nosuchif0\""));
  EXPECT_THAT(address.status().message(), HasSubstr("lo"));
}

TEST(CheckCanListenOnTest, AnAddressOfThisMachineOrANameResolvingToOne) {
  EXPECT_TRUE(CheckCanListenOn("127.0.0.1").ok());
  EXPECT_TRUE(CheckCanListenOn("localhost").ok());
}

TEST(CheckCanListenOnTest, AnotherMachinesAddressIsRefusedNamingIt) {
  // 198.18.0.0/15 is reserved for network tests: no interface here has this one.
  absl::Status s = CheckCanListenOn("198.18.255.254");
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cannot listen on \"198.18.255.254\""));
  EXPECT_THAT(s.message(), HasSubstr("not an address of this machine"));
  s = CheckCanListenOn("no-such-host.invalid");
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("\"no-such-host.invalid\" does not resolve"));
}

TEST(ResolvesOnlyToLoopbackTest, LoopbackNamesAndAddresses) {
  EXPECT_TRUE(ResolvesOnlyToLoopback("127.0.1.1"));
  EXPECT_TRUE(ResolvesOnlyToLoopback("::1"));
  EXPECT_TRUE(ResolvesOnlyToLoopback("localhost"));
  EXPECT_FALSE(ResolvesOnlyToLoopback("198.18.0.1"));
  EXPECT_FALSE(ResolvesOnlyToLoopback("no-such-host.invalid"));
}

TEST(ResolveCommSettingsTest, FlagsWinOverTheInheritedEnvironment) {
  CommFlags flags;
  flags.network_interface = "eth1";
  flags.ib_hcas = "mlx5_0,mlx5_1";
  flags.socket_threads = 4;
  flags.nccl_env = {"NCCL_DEBUG=INFO", "NCCL_P2P_DISABLE=1"};
  auto settings = ResolveCommSettings(
      flags, {"PATH=/bin", "NCCL_SOCKET_IFNAME=eth0", "NCCL_DEBUG=WARN", "NCCL_ALGO=Ring",
              "NCCLX=1", "NCCL_=2"});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->network_interface(), "eth1");
  EXPECT_EQ(settings->ib_hcas(), "mlx5_0,mlx5_1");
  EXPECT_EQ(settings->socket_threads(), 4);
  EXPECT_THAT(settings->nccl_env(),
              UnorderedElementsAre(Pair("NCCL_SOCKET_IFNAME", "eth1"),
                                   Pair("NCCL_IB_HCA", "mlx5_0,mlx5_1"),
                                   Pair("NCCL_SOCKET_NTHREADS", "4"), Pair("NCCL_DEBUG", "INFO"),
                                   Pair("NCCL_P2P_DISABLE", "1"), Pair("NCCL_ALGO", "Ring")));
}

TEST(ResolveCommSettingsTest, NothingGivenReportsTheInheritedNcclVariables) {
  auto settings = ResolveCommSettings({}, {"HOME=/root", "NCCL_IB_DISABLE=1"});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->network_interface(), "");
  EXPECT_THAT(settings->nccl_env(), UnorderedElementsAre(Pair("NCCL_IB_DISABLE", "1")));
}

// Each bad flag is refused with the flag's name and what is wrong.
TEST(ResolveCommSettingsTest, BadFlagsAreNamed) {
  struct Case {
    CommFlags flags;
    const char* message;
  };
  CommFlags list_interface;
  list_interface.network_interface = "^docker,lo";
  CommFlags threads;
  threads.socket_threads = 17;
  CommFlags hca;
  hca.ib_hcas = "mlx5_0 mlx5_1";
  CommFlags not_nccl;
  not_nccl.nccl_env = {"GLOO_SOCKET_IFNAME=eth0"};
  CommFlags no_value;
  no_value.nccl_env = {"NCCL_DEBUG"};
  CommFlags twice;
  twice.network_interface = "eth0";
  twice.nccl_env = {"NCCL_SOCKET_IFNAME=eth1"};
  for (const Case& c : {Case{list_interface, "--net-interface: \"^docker,lo\" is not one"},
                        Case{threads, "--nccl-socket-threads: must be 1-16"},
                        Case{hca, "--nccl-ib-hca: \"mlx5_0 mlx5_1\""},
                        Case{not_nccl, "--nccl-env: \"GLOO_SOCKET_IFNAME=eth0\" is not"},
                        Case{no_value, "--nccl-env: \"NCCL_DEBUG\" is not NCCL_NAME=value"},
                        Case{twice, "--nccl-env NCCL_SOCKET_IFNAME and --net-interface"}}) {
    auto settings = ResolveCommSettings(c.flags, {});
    ASSERT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(settings.status().message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace weft::worker
