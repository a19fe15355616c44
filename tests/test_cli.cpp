// The kiln tool as a user meets it: settings, arguments, output, signals.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

struct CliTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  std::string env() const { return "KILN_CACHE_DIR=" + (dir.path() / "cache").string() + " KILN_BENCH_BUDGET_MS=2 "; }
  // Runs kiln; stdout and stderr apart.
  struct Out {
    int code = -1;
    std::string out, err;
  };
  Out kiln(const std::string& args, const std::string& extra_env = "") const {
    fs::path o = dir.path() / "stdout", e = dir.path() / "stderr";
    ProcessResult r = run_process({"bash", "-c", env() + extra_env + " " + test::kiln_exe() + " " + args + " >" +
                                                     o.string() + " 2>" + e.string()},
                                  300);
    return {r.signal ? 128 + r.signal : r.exit_code, read_file(o).value_or(""), read_file(e).value_or("")};
  }
  std::string fill_spec() const {
    test::write(dir.path() / "fill.cpp", test::kFillSource);
    test::write(dir.path() / "k.toml", test::kFillSpec);
    return (dir.path() / "k.toml").string();
  }
};

// The entries of a temporary folder whose names start with `prefix`. Each
// test gives the kiln it runs a TMPDIR of its own, so what other processes
// (another test run, a tool) leave in /tmp meanwhile cannot fail it.
std::set<std::string> tmp_entries(const fs::path& tmp, const std::string& prefix) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(tmp))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.insert(e.path().string());
  return out;
}

}  // namespace

TEST_F(CliTest, ArgumentsAreCheckedStrictly) {
  std::string spec = fill_spec();
  Out bogus = kiln("bogus");
  EXPECT_EQ(bogus.code, 2);
  EXPECT_NE(bogus.err.find("unknown command 'bogus'"), std::string::npos) << bogus.err;
  Out tail = kiln("report " + spec + " --set N=10abc");
  EXPECT_EQ(tail.code, 2);
  EXPECT_NE(tail.err.find("N=10abc: not a whole number"), std::string::npos) << tail.err;
  Out unknown = kiln("report " + spec + " --set N=10 --set bogus=1");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("has no scalar 'bogus'"), std::string::npos) << unknown.err;
  Out negative = kiln("tune " + spec + " --set N=10 --max-configs -5");
  EXPECT_EQ(negative.code, 2) << negative.err;
  // -q works after the subcommand too.
  Out quiet = kiln("tune " + spec + " --set N=10 -q");
  EXPECT_EQ(quiet.code, 0) << quiet.err;
  // A seed is all of a whole number in 64 bits: not wrapped from -1, not clamped from 2^64.
  for (const char* seed : {"-1", "18446744073709551616", "7x"}) {
    Out bad_seed = kiln("tune " + spec + " --set N=10 --seed " + seed);
    EXPECT_EQ(bad_seed.code, 2) << seed;
    EXPECT_NE(bad_seed.err.find("a seed is a whole number from 0 to 18446744073709551615"), std::string::npos)
        << bad_seed.err;
  }
  // kiln pack refuses a --set name that none of its specs or programs has, before tuning anything.
  Out typo = kiln("pack " + spec + " --set N=10 --set Nn=4 -o " + (dir.path() / "x.kiln").string());
  EXPECT_EQ(typo.code, 2);
  EXPECT_NE(typo.err.find("--set Nn=4: no spec or program given has a scalar or symbol 'Nn' (they have: N)"),
            std::string::npos)
      << typo.err;
  EXPECT_FALSE(fs::exists(dir.path() / "x.kiln"));
  // --set (and plan's --grid) takes one value an occurrence: the files after it are the
  // command's, not more values (kiln pack said "specs is required", kiln run and tune read
  // the file's name as a NAME=VALUE).
  Out pack_first = kiln("pack --set N=10 " + spec + " -o " + (dir.path() / "first.kiln").string());
  EXPECT_EQ(pack_first.code, 0) << pack_first.err;
  EXPECT_TRUE(fs::exists(dir.path() / "first.kiln"));
  Out tune_first = kiln("tune --set N=10 " + spec + " -q");
  EXPECT_EQ(tune_first.code, 0) << tune_first.err;
  Out report_first = kiln("report --set N=10 " + spec);
  EXPECT_EQ(report_first.code, 0) << report_first.err;
  Out run_first = kiln("run --set T=2 " + test::kernels() + "/programs/mlp_cpu.toml");
  EXPECT_EQ(run_first.code, 0) << run_first.err;
  Out plan_first = kiln("plan --grid N=4:64 " + spec);  // refused by plan itself, before it tunes anything
  EXPECT_EQ(plan_first.code, 2);
  EXPECT_EQ(plan_first.err.find("required"), std::string::npos) << plan_first.err;
  EXPECT_NE(plan_first.err.find("--grid N=4:64: write NAME=LO:HI:COUNT"), std::string::npos) << plan_first.err;
}

// What hostile testing found in the command line: a name set twice was taken silently by
// some commands (run kept the last, report the first); nan passed the range checks of --slack
// (and replaced a stored plan with an empty one) and --budget-seconds; --first-only --json
// printed text; --loop was ignored with --first-only and its errors named --set; tune of a
// program said its kind was unknown.
TEST_F(CliTest, WhatHostileTestingFoundOnTheCommandLine) {
  const std::string spec = fill_spec(), programs = test::kernels() + "/programs/";
  const std::string softmax = test::kernels() + "/cpu/softmax.toml";
  Out twice = kiln("report " + spec + " --set N=10 --set N=11");
  EXPECT_EQ(twice.code, 2);
  EXPECT_NE(twice.err.find("--set N=11: 'N' is set twice (N=10 before)"), std::string::npos) << twice.err;
  Out run_twice = kiln("run " + programs + "mlp_cpu.toml --set T=2 --set T=3");
  EXPECT_EQ(run_twice.code, 2);
  EXPECT_NE(run_twice.err.find("'T' is set twice"), std::string::npos) << run_twice.err;
  for (const char* nan : {"nan", "inf", "1e999"}) {
    Out slack = kiln("plan " + softmax + " --slack " + nan + " --grid M=8:64:2 --grid N=16:64:2");
    EXPECT_EQ(slack.code, 2) << nan;
    EXPECT_NE(slack.err.find("--slack: "), std::string::npos) << slack.err;
    EXPECT_NE(slack.err.find("expected a finite number, not '" + std::string(nan) + "'"), std::string::npos) << slack.err;
    Out budget = kiln("tune " + spec + " --set N=10 --budget-seconds " + nan);
    EXPECT_EQ(budget.code, 2) << nan;
    EXPECT_NE(budget.err.find("--budget-seconds: "), std::string::npos) << budget.err;
    EXPECT_NE(budget.err.find("expected a finite number"), std::string::npos) << budget.err;
  }
  // --grid takes whole numbers only ("2.5" read as 2), and a grid up to 2^63-1 stays within it.
  for (const char* g : {"M=8:64:2.5", "M=8:64:2x", "=8:64:2", "M=8:64:", "M=8.5:64:2"}) {
    Out grid = kiln("plan " + softmax + " --grid " + g + " --grid N=16:16:1");
    EXPECT_EQ(grid.code, 2) << g;
    EXPECT_NE(grid.err.find("--grid " + std::string(g) + ": write NAME=LO:HI:COUNT, whole numbers"), std::string::npos)
        << grid.err;
  }
  Out huge = kiln("plan " + softmax + " --grid M=9223372036854775807:9223372036854775807:1 --grid N=16:16:1");
  EXPECT_EQ(huge.code, 2);
  EXPECT_NE(huge.err.find("evaluating 'M * N': overflow"), std::string::npos) << huge.err;  // not a wrapped, negative M
  // A shapes file with a NUL: named by line and byte (the message quoting the value was cut at it).
  test::write(dir.path() / "nul.shapes", std::string("M=8 N=16\nM=3\0 N=5\n", 18));
  Out nul = kiln("plan " + softmax + " --shapes " + (dir.path() / "nul.shapes").string());
  EXPECT_EQ(nul.code, 2);
  EXPECT_NE(nul.err.find("nul.shapes:2: byte 4 (0x00) is not text"), std::string::npos) << nul.err;
  // A link inside the cache is refused by name (it read "Not a directory").
  fs::create_directories(dir.path() / "linked" / "real-tune");
  fs::create_directories(dir.path() / "linked" / "cache");
  fs::create_directory_symlink(dir.path() / "linked" / "real-tune", dir.path() / "linked" / "cache" / "tune");
  Out link = kiln("tune " + softmax + " --set M=8 --set N=16", "KILN_CACHE_DIR=" + (dir.path() / "linked" / "cache").string());
  EXPECT_EQ(link.code, 1) << link.err;
  EXPECT_NE(link.err.find("/cache/tune' is a symbolic link: kiln follows no link inside its cache"), std::string::npos)
      << link.err;
  fs::create_symlink(dir.path() / "not-there", dir.path() / "dangling");
  Out dangling = kiln("tune " + softmax + " --set M=8 --set N=16", "KILN_CACHE_DIR=" + (dir.path() / "dangling").string());
  EXPECT_NE(dangling.err.find("/dangling' is a symbolic link to '" + (dir.path() / "not-there").string() +
                              "', which is not there"),
            std::string::npos)
      << dangling.err;
  // A kernel spec's --set takes lists as a program's does; a shape given twice is packed once.
  Out listed = kiln("pack " + softmax + " --set M=8,16 --set N=16 --set M=8 -o " + (dir.path() / "l.kiln").string());
  EXPECT_EQ(listed.code, 0) << listed.err;
  EXPECT_NE(listed.out.find("packed 1 kernels, 2 records"), std::string::npos) << listed.out;
  // A program and a kernel spec with --hints: the spec at its hint points (it was asked for T's values).
  Out mixed = kiln("pack " + programs + "mlp_cpu.toml " + softmax + " --set T=1 --hints -o " +
                   (dir.path() / "m.kiln").string());
  EXPECT_EQ(mixed.code, 0) << mixed.err;
  EXPECT_NE(mixed.err.find("softmax at M="), std::string::npos) << mixed.err;
  // A program's kernels list the keys and choices packed (they were empty); the same program
  // twice packs its records once.
  const std::string p_kiln = (dir.path() / "p.kiln").string();
  Out prog_twice = kiln("pack " + programs + "mlp_cpu.toml " + programs + "mlp_cpu.toml --set T=1 -o " + p_kiln);
  EXPECT_EQ(prog_twice.code, 0) << prog_twice.err;
  EXPECT_NE(prog_twice.out.find("packed 3 kernels, 3 records"), std::string::npos) << prog_twice.out;
  Out inspect = kiln("inspect " + p_kiln + " --json");
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  const nlohmann::json manifest = nlohmann::json::parse(inspect.out);  // (a temporary would end before the loop)
  for (const auto& k : manifest["kernels"]) {
    EXPECT_EQ(k["keys"].size(), 1u) << k.dump();
    EXPECT_EQ(k["choices"].size(), 1u) << k.dump();
  }
  // Refused before anything is tuned: a bad value in a list, a spec twice, a folder for -o not there.
  for (const std::string& bad : {std::string("--set M=8 --set N=16,x -o ") + (dir.path() / "b.kiln").string(),
                                 std::string("--set M=8 --set N=16 -o ") + (dir.path() / "nowhere" / "b.kiln").string()}) {
    Out o = kiln("pack " + softmax + " " + bad);
    EXPECT_EQ(o.code, 2) << bad << "\n" << o.err;
    EXPECT_EQ(o.err.find("softmax at "), std::string::npos) << "tuned before the refusal: " << o.err;
  }
  Out twice_spec = kiln("pack " + softmax + " " + softmax + " --set M=8 --set N=16 -o " + (dir.path() / "t.kiln").string());
  EXPECT_NE(twice_spec.err.find("two specs name the kernel 'softmax'"), std::string::npos) << twice_spec.err;
  EXPECT_EQ(twice_spec.err.find("softmax at "), std::string::npos) << twice_spec.err;
  // A kernel spec beside a program that runs the same spec packs it once, in either order (a
  // spec after the program was refused, after the program had been tuned); a copy of it in
  // another folder, under the same name, is refused before anything is tuned.
  const std::string rmsnorm = test::kernels() + "/cpu/rmsnorm.toml", sets = " --set T=1 --set H=256 --set eps=1e-5 -o ";
  for (const std::string& order : {programs + "mlp_cpu.toml " + rmsnorm, rmsnorm + " " + programs + "mlp_cpu.toml"}) {
    Out both = kiln("pack " + order + sets + (dir.path() / "both.kiln").string());
    EXPECT_EQ(both.code, 0) << order << "\n" << both.err;
    EXPECT_NE(both.out.find("packed 3 kernels, 3 records"), std::string::npos) << order << "\n" << both.out;
    Out listed_once = kiln("inspect " + (dir.path() / "both.kiln").string() + " --json");
    ASSERT_EQ(listed_once.code, 0) << listed_once.err;
    const nlohmann::json kernels = nlohmann::json::parse(listed_once.out)["kernels"];
    EXPECT_EQ(kernels.size(), 3u) << kernels.dump();
    for (const auto& k : kernels) EXPECT_EQ(k["keys"].size(), 1u) << order << "\n" << k.dump();
  }
  fs::create_directories(dir.path() / "copy");
  fs::copy_file(rmsnorm, dir.path() / "copy" / "rmsnorm.toml");
  fs::copy_file(test::kernels() + "/cpu/rmsnorm.cpp", dir.path() / "copy" / "rmsnorm.cpp");
  Out copy = kiln("pack " + programs + "mlp_cpu.toml " + (dir.path() / "copy" / "rmsnorm.toml").string() + sets +
                  (dir.path() / "copy.kiln").string());
  EXPECT_EQ(copy.code, 2) << copy.err;
  EXPECT_NE(copy.err.find("two specs name the kernel 'rmsnorm': " +
                          fs::weakly_canonical(dir.path() / "copy" / "rmsnorm.toml").string()),
            std::string::npos)
      << copy.err;
  EXPECT_EQ(copy.err.find("every step tuned"), std::string::npos) << "tuned before the refusal: " << copy.err;
  {  // two programs whose kernels of one name are two specs: refused too (the second shared the first's entry)
    std::string text = *read_file(programs + "mlp_cpu.toml");
    const std::string from = "\"../cpu/rmsnorm.toml\"";
    text.replace(text.find(from), from.size(), "\"rmsnorm.toml\"");
    for (std::string rel : {std::string("\"../cpu/linear.toml"), std::string("\"../cpu/linear.toml")})
      text.replace(text.find(rel), rel.size(), "\"" + test::kernels() + "/cpu/linear.toml");
    const std::string ref = "\"mlp_reference.toml\"";
    text.replace(text.find(ref), ref.size(), "\"" + programs + "mlp_reference.toml\"");
    test::write(dir.path() / "copy" / "mlp.toml", text);
    Out two = kiln("pack " + programs + "mlp_cpu.toml " + (dir.path() / "copy" / "mlp.toml").string() + " --set T=1 -o " +
                   (dir.path() / "two.kiln").string());
    EXPECT_EQ(two.code, 2) << two.err;
    EXPECT_NE(two.err.find("(run by program " + programs + "mlp_cpu.toml), and "), std::string::npos) << two.err;
    EXPECT_EQ(two.err.find("every step tuned"), std::string::npos) << "tuned before the refusal: " << two.err;
    // and within one program (another [kernels] entry of the same kernel name, from another file)
    const std::string down = "down    = ";
    text.insert(text.find(down), "norm2   = \"" + test::kernels() + "/cpu/rmsnorm.toml\"\n");
    test::write(dir.path() / "copy" / "mlp2.toml", text);
    Out one = kiln("pack " + (dir.path() / "copy" / "mlp2.toml").string() + " --set T=1 -o " +
                   (dir.path() / "one.kiln").string());
    EXPECT_EQ(one.code, 2) << one.err;
    EXPECT_NE(one.err.find("(run by it too)"), std::string::npos) << one.err;
    EXPECT_EQ(one.err.find("every step tuned"), std::string::npos) << "tuned before the refusal: " << one.err;
  }
  // Shapes files: a byte-order mark and CR line ends read; a bad value named by its line, before tuning.
  test::write(dir.path() / "cr.shapes", "\xEF\xBB\xBFM=8 N=16\rM=16 N=16\rN=16, M=08\r");  // the third is the first
  Out cr = kiln("plan " + softmax + " --shapes " + (dir.path() / "cr.shapes").string());
  EXPECT_EQ(cr.code, 0) << cr.err;
  EXPECT_NE(cr.out.find("2 training shapes"), std::string::npos) << cr.out;
  test::write(dir.path() / "bad.shapes", "M=8 N=16\n\nM=+16 N=16\n");
  Out bad_value = kiln("plan " + softmax + " --shapes " + (dir.path() / "cr.shapes").string() + " --eval " +
                       (dir.path() / "bad.shapes").string());
  EXPECT_EQ(bad_value.code, 2);
  EXPECT_NE(bad_value.err.find("bad.shapes:3: M=+16: not a whole number"), std::string::npos) << bad_value.err;
  EXPECT_EQ(bad_value.err.find("[1/"), std::string::npos) << "tuned before the refusal: " << bad_value.err;
  Out empty_item = kiln("pack " + softmax + " --set M=8, --set N=16 -o " + (dir.path() / "e.kiln").string());
  EXPECT_EQ(empty_item.code, 2);
  EXPECT_NE(empty_item.err.find("--set M=8,: an empty value in the list"), std::string::npos) << empty_item.err;
  const std::string decoder = "run " + programs + "decoder_cpu.toml --set T=2 --set S=5 --set CAP=64 --first-only";
  Out first = kiln(decoder + " --json --show");
  ASSERT_EQ(first.code, 0) << first.err;
  nlohmann::json j = nlohmann::json::parse(first.out);  // one object, nothing before it
  EXPECT_GT(j["first_call_s"].get<double>(), 0);
  EXPECT_EQ(j["program"], "decoder_cpu");
  EXPECT_TRUE(j["show"].is_string());
  Out loop = kiln(decoder + " --loop S=3");
  EXPECT_EQ(loop.code, 2);
  EXPECT_NE(loop.err.find("--loop times calls after the first"), std::string::npos) << loop.err;
  Out loop_text = kiln("run " + programs + "decoder_cpu.toml --set T=2 --set S=5 --set CAP=64 --loop S");
  EXPECT_EQ(loop_text.code, 2);
  EXPECT_NE(loop_text.err.find("--loop S: expected NAME=VALUE"), std::string::npos) << loop_text.err;
  // Values that overflow a guard or a size: a usage error naming where.
  Out guard = kiln("run " + programs + "decoder_cpu.toml --set S=9223372036854775807 --set T=1 --set CAP=64");
  EXPECT_EQ(guard.code, 2);
  EXPECT_NE(guard.err.find("program 'decoder_cpu': guard 'S + T <= CAP' cannot be evaluated"), std::string::npos)
      << guard.err;
  Out size = kiln("tune " + test::kernels() + "/cpu/matmul.toml --set M=3037000500 --set N=3037000500 --set K=1");
  EXPECT_EQ(size.code, 2);
  EXPECT_NE(size.err.find("kernel 'matmul': the size of argument"), std::string::npos) << size.err;
  // A spec that is not a file, a member named twice, a view of row -1.
  Out dev_null = kiln("compile /dev/null");
  EXPECT_NE(dev_null.err.find("/dev/null: not a regular file"), std::string::npos) << dev_null.err;
  Out member = kiln("compile " + test::kernels() + "/cpu/linear.toml:f32_nt:extra");
  EXPECT_NE(member.err.find("as FILE:MEMBER, a member of a family in FILE"), std::string::npos) << member.err;
  std::string model = *read_file(programs + "model_cpu.toml");
  ASSERT_NE(model.find("\"h[L % 2]\""), std::string::npos);
  model.replace(model.find("\"h[L % 2]\""), 10, "\"h[-1]\"");
  for (size_t at; (at = model.find("\"../cpu/")) != std::string::npos;) model.replace(at, 8, "\"" + test::kernels() + "/cpu/");
  for (const char* f : {"\"decoder_cpu.toml\"", "\"model_reference.toml\""})
    for (size_t at; (at = model.find(f)) != std::string::npos;) model.replace(at, 1, "\"" + programs);
  test::write(dir.path() / "model.toml", model);
  Out row = kiln("run " + (dir.path() / "model.toml").string() + " --set T=2 --set S=5 --set CAP=64");
  EXPECT_NE(row.code, 0);
  EXPECT_NE(row.err.find("'h[-1]' is row -1 of 'h'; rows are counted from 0"), std::string::npos) << row.err;
  // A step's program's guard that fails names that step and program (it read as the outer program's own).
  const std::string bound = "bind    = { x = \"x\",";
  ASSERT_NE(model.find(bound), std::string::npos);
  model.replace(model.find("\"h[-1]\""), 7, "\"h[L % 2]\"");
  model.replace(model.find(bound), bound.size(), "bind    = { x = \"w_lm\",");
  test::write(dir.path() / "model.toml", model);
  Out bind = kiln("run " + (dir.path() / "model.toml").string() + " --set T=2 --set S=5 --set CAP=64");
  EXPECT_EQ(bind.code, 2);
  EXPECT_NE(bind.err.find("(steps[0]: program 'decoder_cpu' guards 'S + T <= CAP') does not hold"), std::string::npos)
      << bind.err;
  // kiln pack -o over a device, a pipe or a link: refused before anything is tuned, the path left
  // as it was (it was replaced by a regular file: as root, -o /dev/null replaced /dev/null).
  const fs::path fifo = dir.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  Out pack = kiln("pack " + spec + " --set N=10 -o " + fifo.string());
  EXPECT_EQ(pack.code, 2);
  EXPECT_NE(pack.err.find("exists and is not a regular file"), std::string::npos) << pack.err;
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo)));
  Out program = kiln("tune " + programs + "mlp_cpu.toml --set T=4");
  EXPECT_NE(program.code, 0);
  EXPECT_NE(program.err.find("a program (kind = \"program\"), not a kernel spec: run it with `kiln run`"),
            std::string::npos)
      << program.err;
}

TEST_F(CliTest, SettingsAreCheckedStrictly) {
  std::string spec = fill_spec();
  for (const char* bad : {"KILN_COMPILE_TIMEOUT=inf", "KILN_COMPILE_TIMEOUT=1e300", "KILN_BENCH_BUDGET_MS=' 1'",
                          "KILN_BENCH_BUDGET_MS=0x10", "KILN_BENCH_TIMEOUT=nan", "KILN_LOG=abc",
                          "KILN_CUDA_WARM_LIBRARIES=maybe", "KILN_PROGRAM_CELLS=sometimes", "KILN_FIRST_CALL=later",
                          "KILN_COMPILE_MODE=fast", "KILN_ARTIFACT_MISMATCH=ignore", "KILN_BENCH_L2_FLUSH=both"}) {
    Out r = kiln("compile " + spec, bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.err;
    std::string var = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_NE(r.err.find(var), std::string::npos) << r.err;
  }
  // A variable that names a choice lists them.
  Out r = kiln("compile " + spec, "KILN_PROGRAM_CELLS=sometimes");
  EXPECT_NE(r.err.find("KILN_PROGRAM_CELLS='sometimes' is not one of graphs, always, off"), std::string::npos) << r.err;
  // ... and a right one is taken.
  Out ok = kiln("compile " + spec, "KILN_BENCH_L2_FLUSH=read");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST_F(CliTest, ExplainAsJsonIsJson) {
  Out r = kiln("compile --explain --json " + fill_spec());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["configs"].size(), 6u);
  EXPECT_TRUE(j["configs"][0]["explain"]["toolchain"].is_string());
  EXPECT_EQ(j["configs"][0]["explain"]["defines"], "BLOCK=1;SCALE=1;");
}

TEST_F(CliTest, CacheStatsCreatesNothingAndSpeaksJsonForAnyFolderName) {
  fs::path nowhere = dir.path() / "not-yet";
  Out r = kiln("cache stats", "KILN_CACHE_DIR=" + nowhere.string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(nowhere));
  fs::path odd = dir.path() / "caf\xe9-\xff";  // not UTF-8
  Out j = kiln("cache stats --json", "KILN_CACHE_DIR='" + odd.string() + "'");
  ASSERT_EQ(j.code, 0) << j.err;
  auto parsed = nlohmann::json::parse(j.out);
  EXPECT_EQ(parsed["binaries"]["entries"], 0);
}

// A kernel's printf goes to stderr, never into kiln's results.
TEST_F(CliTest, AKernelsOutputNeverMixesIntoStdout) {
  test::write(dir.path() / "noisy.cpp", R"SRC(#include <cstdio>
void noisy(kiln::program_id, int64_t* out, int64_t n) {
  std::printf("noise from the kernel\n");
  std::fflush(stdout);
  for (int64_t i = 0; i < n; ++i) out[i] = i;
}
)SRC");
  test::write(dir.path() / "n.toml", R"SPEC(name = "noisy"
backend = "cpu"
source = "noisy.cpp"
entry = "noisy"
grid = ["1"]
args = [ { name = "out", type = "i64*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
[params]
V = [0, 1]
)SPEC");
  for (const char* mode : {"", "KILN_TUNE_IN_PROCESS=1"}) {
    Out r = kiln("tune --json --force " + (dir.path() / "n.toml").string() + " --set n=10", mode);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NO_THROW(nlohmann::json::parse(r.out)) << mode << ": " << r.out.substr(0, 200);
    EXPECT_NE(r.err.find("noise from the kernel"), std::string::npos) << mode;
  }
}

// A compiler warning that is not UTF-8 must not fail the cache's metadata.
TEST_F(CliTest, ACompilerMessageThatIsNotUtf8IsKept) {
  test::write(dir.path() / "fill.cpp", std::string("#warning \"bad byte \xff\"\n") + test::kFillSource);
  test::write(dir.path() / "k.toml", test::kFillSpec);
  for (const char* cache : {"", "KILN_NO_CACHE=1"}) {
    Out r = kiln("compile --json " + (dir.path() / "k.toml").string(), cache);
    ASSERT_EQ(r.code, 0) << cache << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["totals"]["failed"], 0);
  }
}

TEST_F(CliTest, AConfigSpaceTooLargeToCountIsASpecError) {
  std::string params = "[params]\n";
  for (int i = 0; i < 64; ++i) params += "P" + std::to_string(i) + " = [0, 1]\n";
  test::write(dir.path() / "fill.cpp", test::kFillSource);
  std::string toml = test::kFillSpec;
  toml = toml.substr(0, toml.find("[params]")) + params;
  test::write(dir.path() / "k.toml", toml);
  Out r = kiln("tune " + (dir.path() / "k.toml").string() + " --set N=4 --search coordesc");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("more configs than a 64-bit count holds"), std::string::npos) << r.err;
}

// Tuning leaves nothing in /tmp: binaries load from memory.
TEST_F(CliTest, TuningLeavesNoTemporaryFolders) {
  const fs::path tmp = dir.path() / "tmp", args = dir.path() / "cxx-args", cxx = dir.path() / "logging-cxx";
  fs::create_directories(tmp);
  // A compiler that notes its arguments, to show the compiles ran in that TMPDIR.
  test::write(cxx, "#!/bin/sh\necho \"$@\" >> " + args.string() + "\nexec c++ \"$@\"\n");
  ::chmod(cxx.c_str(), 0755);
  Out r = kiln("tune " + fill_spec() + " --set N=100", "TMPDIR=" + tmp.string() + " KILN_CXX=" + cxx.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(read_file(args).value_or("").find(tmp.string() + "/kiln-cc-"), std::string::npos)
      << "the compiles did not run in the TMPDIR given";
  EXPECT_EQ(tmp_entries(tmp, "kiln-so-"), std::set<std::string>{});
  EXPECT_EQ(tmp_entries(tmp, "kiln-cc-"), std::set<std::string>{});
}

// SIGTERM (or Ctrl-C) during a compile: the compilers die with kiln, and its
// temporary folders go.
TEST_F(CliTest, InterruptingACompileLeavesNoCompilersOrFolders) {
  fs::path pids = dir.path() / "pids";
  fs::path cxx = dir.path() / "slow-cxx";
  test::write(cxx, "#!/bin/sh\nif [ \"$1\" = --version ]; then exec c++ --version; fi\necho $$ >> " + pids.string() +
                       "\nsleep 60\n");
  ::chmod(cxx.c_str(), 0755);
  std::string spec = fill_spec();
  const fs::path tmp = dir.path() / "tmp";
  fs::create_directories(tmp);
  std::string cmd = env() + "TMPDIR=" + tmp.string() + " KILN_NO_CACHE=1 KILN_CXX=" + cxx.string() + " exec " + test::kiln_exe() + " compile " + spec;
  pid_t pid = -1;
  {
    // Started as a child of ours, so we can signal and reap it.
    std::vector<char*> argv = {const_cast<char*>("bash"), const_cast<char*>("-c"), cmd.data(), nullptr};
    pid = ::fork();
    if (pid == 0) {
      ::execvp("bash", argv.data());
      ::_exit(127);
    }
  }
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 500 && !(fs::exists(pids) && fs::file_size(pids) > 0); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(fs::exists(pids)) << "no compiler started";
  EXPECT_FALSE(tmp_entries(tmp, "kiln-cc-").empty()) << "the compile did not run in the TMPDIR given";
  std::this_thread::sleep_for(200ms);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  std::this_thread::sleep_for(200ms);
  std::string text = *read_file(pids);
  size_t start = 0;
  int seen = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    pid_t c = std::stoi(text.substr(start, end - start));
    ++seen;
    auto stat = read_file("/proc/" + std::to_string(c) + "/stat");
    EXPECT_TRUE(!stat || stat->find(") Z ") != std::string::npos) << "compiler " << c << " outlived kiln";
    start = end + 1;
  }
  EXPECT_GE(seen, 1);
  EXPECT_EQ(tmp_entries(tmp, "kiln-cc-"), std::set<std::string>{}) << "temporary compile folders left behind";
}

// The main job, small: every row of its table is there, the result checks
// against a plain loop, and the library choice is timed beside the oracle
// (or skipped with its reason where OpenBLAS is absent).
TEST_F(CliTest, TheDemoComparesHintsOracleTemplatesAndTheLibrary) {
  fs::path js = dir.path() / "demo.json";
  Out r = kiln("-q demo --sizes 24,37 --json " + js.string());
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* row : {"tuned at 64", "size-hint multi-kernel", "oracle: tuned at the size",
                          "templates only, tuned at the size", "kiln / oracle", "check: ", "OK",
                          "multi-kernel softmax"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  nlohmann::json j = nlohmann::json::parse(*read_file(js));
  EXPECT_EQ(j["sizes"], nlohmann::json({24, 37}));
  EXPECT_TRUE(j["check"]["ok"].get<bool>());
  ASSERT_EQ(j["oracle"]["ms"].size(), 2u);
  for (double ms : j["oracle"]["ms"]) EXPECT_GT(ms, 0);
  for (const auto& c : j["templates_only"]["config"]) EXPECT_EQ(c.get<std::string>().find("library:"), std::string::npos);
  EXPECT_EQ(j["library"]["name"], "openblas_sgemm");
  if (j["library"].contains("skipped")) {
    EXPECT_NE(r.out.find("the library choice is skipped"), std::string::npos) << r.out;
  } else {
    EXPECT_EQ(j["ratios"]["oracle_over_library"].size(), 2u);
    EXPECT_NE(r.out.find("library: openblas_sgemm"), std::string::npos) << r.out;
  }
  Out bad = kiln("demo --sizes 24,x");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--sizes: 'x' is not a size"), std::string::npos) << bad.err;
}

// kiln tune of a multi-kernel spec: each variant's time and the choice, then
// the same from the records; a missing scalar and --plot are refused.
TEST_F(CliTest, TuneOfAMultiKernelTimesItsVariants) {
  const std::string spec = test::kernels() + "/cpu/softmax_multi.toml";
  Out r = kiln("tune " + spec + " --set M=8 --set N=300");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("multi-kernel softmax_multi at M=8 N=300"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0: softmax_rowwise"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1: softmax_twopass"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chose variant "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; benchmarked in"), std::string::npos) << r.out;
  Out j = kiln("tune --json " + spec + " --set M=8 --set N=300");
  ASSERT_EQ(j.code, 0) << j.err;
  nlohmann::json o = nlohmann::json::parse(j.out);
  EXPECT_EQ(o["source"], "cache");
  ASSERT_EQ(o["variants"].size(), 2u);
  EXPECT_TRUE(o["variants"][0]["ns"].is_number() && o["variants"][1]["ns"].is_number()) << j.out;
  EXPECT_EQ(o["variants"][o["variant"].get<int>()]["name"], o["name"]);
  Out missing = kiln("tune " + spec + " --set M=8");
  EXPECT_EQ(missing.code, 2) << missing.err;
  EXPECT_NE(missing.err.find("N"), std::string::npos) << missing.err;
  Out plot = kiln("tune " + spec + " --set M=8 --set N=300 --plot x.png");
  EXPECT_NE(plot.code, 0);
  EXPECT_NE(plot.err.find("is a multi-kernel"), std::string::npos) << plot.err;
}
