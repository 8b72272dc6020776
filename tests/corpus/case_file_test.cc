#include "corpus/case_file.h"

#include <dirent.h>
#include <ftw.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace gradfuzz::corpus {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

harness::OpSpec op(std::string name, std::vector<std::optional<std::string>> inputs = {},
                   std::vector<harness::OutputBindingSpec> outputs = {}) {
  harness::OpSpec o;
  o.name = std::move(name);
  o.input_channels = std::move(inputs);
  o.output_bindings = std::move(outputs);
  return o;
}

harness::CaseSpec sample_spec() {
  harness::CaseSpec spec;
  spec.ops = {op("RowStat", {}, {{std::string("s"), false}}), op("ScaledSReLU", {std::string("s")})};
  spec.seed = 42;
  spec.fusions = {"BackwardActivationBias"};
  return spec;
}

// POSIX only: std::filesystem's free functions may bind to libtorch.so's broken copies
// (see corpus/case_file.cc).
int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }

size_t count_entries(const fs::path& dir) {
  size_t n = 0;
  DIR* handle = ::opendir(dir.c_str());
  if (!handle) return 0;
  while (const dirent* entry = ::readdir(handle)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") ++n;
  }
  ::closedir(handle);
  return n;
}

class CaseFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/gradfuzz_corpus_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { ::nftw(dir_.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

  fs::path write_text(const std::string& name, const std::string& text) {
    fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }
  nlohmann::json sample_json() {
    return case_file_to_json(make_case_file(sample_spec(), {}, 1, "0.1.0", std::nullopt));
  }
  /// The CorpusError of loading `j` written to a file.
  CorpusError load_error(const nlohmann::json& j, const std::string& name = "case.json") {
    fs::path path = write_text(name, j.dump());
    try {
      load_case_file(path);
    } catch (const CorpusError& e) {
      return e;
    }
    ADD_FAILURE() << "loading " << j.dump() << " did not throw";
    return CorpusError("", "", "");
  }

  fs::path dir_;
};

TEST_F(CaseFileTest, WritesAtomicallyUnderItsContentHashAndLoadsBack) {
  CaseFile file = make_case_file(sample_spec(), {harness::VerdictKind::kMissingGradient, "internal-requires-grad"}, 77,
                                 "0.1.0", std::string("internal-requires-grad"));
  const fs::path path = write_case_file(dir_ / "regression", file);
  EXPECT_EQ(path.filename().string(), spec_hash(file.spec) + ".json");
  EXPECT_EQ(spec_hash(file.spec).size(), 16u);
  EXPECT_EQ(spec_hash(file.spec).find_first_not_of("0123456789abcdef"), std::string::npos);
  // Only the final file remains: no temporary left behind.
  EXPECT_EQ(count_entries(dir_ / "regression"), 1u);
  const CaseFile back = load_case_file(path);
  EXPECT_EQ(back, file);
  EXPECT_EQ(back.provenance.campaign_seed, 77u);
  EXPECT_FALSE(file.provenance.date.empty());
}

TEST_F(CaseFileTest, HashDependsOnTheSpecOnly) {
  harness::CaseSpec a = sample_spec();
  harness::CaseSpec b = sample_spec();
  EXPECT_EQ(spec_hash(a), spec_hash(b));
  b.seed = 43;
  EXPECT_NE(spec_hash(a), spec_hash(b));
  EXPECT_EQ(case_file_name(a), spec_hash(a) + ".json");
}

TEST_F(CaseFileTest, RejectsBadJsonSyntaxNamingTheFile) {
  const fs::path path = write_text("broken.json", "{\"schema_version\": 1, \"spec\": ");
  try {
    load_case_file(path);
    FAIL();
  } catch (const CorpusError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
    EXPECT_THAT(e.what(), HasSubstr("invalid JSON at byte"));
    EXPECT_EQ(e.json_path(), "/");
  }
}

TEST_F(CaseFileTest, RejectsEmptyAndMissingFiles) {
  const fs::path empty = write_text("empty.json", "  \n");
  EXPECT_THROW(
      {
        try {
          load_case_file(empty);
        } catch (const CorpusError& e) {
          EXPECT_THAT(e.what(), HasSubstr("empty.json: /: empty file"));
          throw;
        }
      },
      CorpusError);
  EXPECT_THROW(load_case_file(dir_ / "absent.json"), CorpusError);
}

TEST_F(CaseFileTest, RefusesMoreOpsThanTheLimitBeforeReadingThem) {
  nlohmann::json j = sample_json();
  j["spec"]["ops"] = nlohmann::json::array();
  for (int i = 0; i < 257; ++i) j["spec"]["ops"].push_back({{"name", "ReLU"}});
  const fs::path path = write_text("many_ops.json", j.dump());
  try {
    load_case_file(path);
    FAIL() << "257 ops accepted";
  } catch (const CorpusError& e) {
    EXPECT_EQ(e.json_path(), "/spec/ops");
    EXPECT_THAT(e.what(), HasSubstr("a case of 257 modules is past gradfuzz's limit of 256"));
  }
}

TEST_F(CaseFileTest, RejectsWrongSchemaVersion) {
  nlohmann::json j = sample_json();
  j["schema_version"] = 2;
  const CorpusError e = load_error(j);
  EXPECT_EQ(e.json_path(), "/schema_version");
  EXPECT_THAT(e.what(), HasSubstr("case.json: /schema_version: unsupported schema_version 2"));
}

TEST_F(CaseFileTest, RejectsUnknownOpWithItsPath) {
  nlohmann::json j = sample_json();
  j["spec"]["ops"][1]["name"] = "ScaledSRelu";
  const CorpusError e = load_error(j, "unknown_op.json");
  EXPECT_EQ(e.json_path(), "/spec/ops/1/name");
  EXPECT_THAT(e.what(), HasSubstr("unknown_op.json: /spec/ops/1/name: unknown op 'ScaledSRelu'"));
}

TEST_F(CaseFileTest, ChecksFusionNamesAgainstTheBackendItWasRecordedOn) {
  nlohmann::json j = sample_json();
  j["spec"]["fusions"] = {"ForwardLinearBiasActivation", "GroupedMLP_CuTeGEMMGLU"};
  // A model file names the model's fusions only.
  const CorpusError e = load_error(j, "model.json");
  EXPECT_EQ(e.json_path(), "/spec/fusions/1");
  EXPECT_THAT(e.what(), HasSubstr("unknown fusion 'GroupedMLP_CuTeGEMMGLU'"));
  // A te file may name TE's; the te backend checks them when it runs the case.
  j["backend"] = "te";
  const CaseFile te = case_file_from_json(j, "te.json");
  EXPECT_EQ(te.backend, "te");
  EXPECT_EQ(te.spec.fusions.size(), 2u);
  j["backend"] = "jax";
  EXPECT_EQ(load_error(j).json_path(), "/backend");
}

TEST_F(CaseFileTest, RejectsUndeclaredMissingProducer) {
  nlohmann::json j = sample_json();
  j["spec"]["ops"][1]["input_channels"][0] = "t";
  const CorpusError e = load_error(j);
  EXPECT_EQ(e.json_path(), "/spec/ops/1/input_channels/0");
  EXPECT_THAT(e.what(), HasSubstr("missing-producer"));
  EXPECT_THAT(e.what(), HasSubstr("'t'"));
}

TEST_F(CaseFileTest, AcceptsDeclaredInvalidWiring) {
  harness::CaseSpec spec = sample_spec();
  std::swap(spec.ops[0], spec.ops[1]);  // consumer before producer
  CaseFile file = make_case_file(spec, {}, 0, "0.1.0", std::nullopt);
  ASSERT_EQ(file.wiring_error, std::optional<std::string>("producer-not-earlier"));
  EXPECT_EQ(load_case_file(write_case_file(dir_, file)).spec, spec);

  nlohmann::json j = case_file_to_json(file);
  j["wiring_error"] = "missing-producer";
  EXPECT_EQ(load_error(j).json_path(), "/spec/ops/0/input_channels/0");
  nlohmann::json valid = sample_json();
  valid["wiring_error"] = "missing-producer";
  EXPECT_EQ(load_error(valid).json_path(), "/wiring_error");
}

// A te or torch case's fault is one its backend plants (checked when it runs): a selftest of
// the te backend saves cases under `te-...` faults that replay must load.
TEST_F(CaseFileTest, ABackendsPlantedFaultLoadsAndAMisspelledOneDoesNot) {
  nlohmann::json j = sample_json();
  j["backend"] = "te";
  j["verdict"]["fault"] = "te-fp8-scale-inv-applied-twice";
  j["provenance"]["fault"] = "te-fp8-scale-inv-applied-twice";
  const std::filesystem::path path = dir_ / "te_fault.json";
  std::ofstream(path) << j.dump();
  const CaseFile file = load_case_file(path);
  EXPECT_EQ(file.verdict.fault, std::optional<std::string>("te-fp8-scale-inv-applied-twice"));
  j["verdict"]["fault"] = "Te Fault";
  EXPECT_EQ(load_error(j).json_path(), "/verdict/fault");
  j = sample_json();  // the model's faults are checked against its list
  j["verdict"]["fault"] = "te-fp8-scale-inv-applied-twice";
  EXPECT_THAT(load_error(j).what(), HasSubstr("unknown fault"));
}

TEST_F(CaseFileTest, RejectsBadVerdictProvenanceAndUnknownKeys) {
  nlohmann::json j = sample_json();
  j["verdict"]["kind"] = "bad";
  EXPECT_EQ(load_error(j).json_path(), "/verdict/kind");
  j = sample_json();
  j["verdict"]["fault"] = "no-such-fault";
  EXPECT_EQ(load_error(j).json_path(), "/verdict/fault");
  j = sample_json();
  j["provenance"]["campaign_seed"] = "x";
  EXPECT_EQ(load_error(j).json_path(), "/provenance/campaign_seed");
  j = sample_json();
  j["extra"] = 1;
  EXPECT_EQ(load_error(j).json_path(), "/extra");
  j = sample_json();
  j.erase("verdict");
  EXPECT_THAT(load_error(j).what(), HasSubstr("missing required key 'verdict'"));
  EXPECT_EQ(load_error(nlohmann::json(3)).json_path(), "/");
}

TEST_F(CaseFileTest, ListsFilesAndDirectoriesSorted) {
  write_text("b.json", "{}");
  write_text("a.json", "{}");
  write_text("notes.txt", "");
  write_text(".a.json.tmp.1.0", "");
  ASSERT_EQ(::mkdir((dir_ / "sub").c_str(), 0755), 0);
  std::ofstream(dir_ / "sub" / "c.json") << "{}";
  const auto files = list_case_files(dir_);
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].filename(), "a.json");
  EXPECT_EQ(files[1].filename(), "b.json");
  EXPECT_EQ(files[2].filename(), "c.json");
  EXPECT_EQ(list_case_files(dir_ / "b.json").size(), 1u);
  EXPECT_EQ(list_case_files(std::vector<fs::path>{dir_ / "b.json", dir_ / "sub"}).size(), 2u);
  EXPECT_THROW(list_case_files(dir_ / "nothing"), CorpusError);
}

}  // namespace
}  // namespace gradfuzz::corpus
