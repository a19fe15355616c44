#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "entries.hpp"

namespace fs = std::filesystem;

namespace {
size_t replay(const char* name, void (*fn)(const uint8_t*, size_t)) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(KILN_SOURCE_DIR) / "fuzz/corpus" / name)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    fn(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++n;
  }
  return n;
}
}  // namespace

TEST(FuzzCorpus, ExpressionsReplayWithoutBreakingAPromise) { EXPECT_GT(replay("expr", kiln::fuzz::expr_one), 10u); }
TEST(FuzzCorpus, SpecsReplayWithoutBreakingAPromise) { EXPECT_GT(replay("spec", kiln::fuzz::spec_one), 10u); }
TEST(FuzzCorpus, ProgramsReplayWithoutBreakingAPromise) { EXPECT_GT(replay("program", kiln::fuzz::program_one), 10u); }
TEST(FuzzCorpus, ArtifactsReplayWithoutBreakingAPromise) { EXPECT_GT(replay("artifact", kiln::fuzz::artifact_one), 10u); }
