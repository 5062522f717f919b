// Registry: every load failure of DESIGN.md section 4 is reported clearly, names the file and
// the cause, and leaves the other plugins usable. Uses the plugins built on purpose in
// tests/broken_plugins (one directory per case).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "qrecipe/engine.hpp"
#include "qrecipe/registry.hpp"

using namespace qrecipe;

namespace {

std::string broken_dir(const std::string& case_name) {
  const char* root = std::getenv("QRECIPE_BROKEN_PLUGIN_DIR");
  REQUIRE_MESSAGE(root != nullptr, "QRECIPE_BROKEN_PLUGIN_DIR is not set (run through ctest)");
  return std::string(root) + "/" + case_name;
}

// A registry that sees only the given paths.
RegistryOptions only(std::vector<std::string> paths) {
  RegistryOptions o;
  o.paths = std::move(paths);
  o.use_env = false;
  o.use_install_dir = false;
  o.use_library_dir = false;
  return o;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Loads `good` plus one broken case; the good plugin must still load.
const LoadFailure& single_failure(Registry& r) {
  REQUIRE(r.failures().size() == 1);
  CHECK(r.find("toy") != nullptr);
  return r.failures()[0];
}

}  // namespace

TEST_CASE("a valid plugin loads and describes itself") {
  Registry r(only({broken_dir("good")}));
  REQUIRE(r.failures().empty());
  const FormatPlugin& toy = r.get("toy");
  CHECK(toy.version() == "1.0.0");
  CHECK(toy.supports(Device::cpu()));
  CHECK_FALSE(toy.supports(Device::cuda()));
  REQUIRE(toy.options().size() == 1);
  CHECK(toy.options()[0].key == "flag");
  CHECK(toy.options()[0].type == QR_OPTION_BOOL);
  CHECK(r.loaded_names() == "toy");
}

TEST_CASE("each broken plugin gives a clear failure and the others stay usable") {
  struct Case {
    const char* dir;
    const char* file;
    const char* expected;  // part of the cause
  };
  const Case cases[] = {
      {"not_a_library", "libqrecipe_garbage.so", "not a shared library"},
      {"no_abi_symbol", "libqrecipe_noabi.so", "missing symbol 'qrecipe_plugin_abi'"},
      {"no_entry_symbol", "libqrecipe_noentry.so", "missing symbol 'qrecipe_plugin_entry'"},
      {"wrong_abi", "libqrecipe_wrongabi.so", "plugin ABI version 999 but this qrecipe reads ABI version 1"},
      {"entry_returns_null", "libqrecipe_refuses.so", "returned no descriptor"},
      {"descriptor_abi", "libqrecipe_badversion.so", "descriptor ABI version 7"},
      {"small_descriptor", "libqrecipe_small.so", "struct_size 16"},
      {"missing_slot", "libqrecipe_noslot.so", "leaves a required function slot empty"},
      {"bad_numerator", "libqrecipe_badnumerator.so",
       "declares tensor_scale_numerator -2688 in its descriptor; expected 0 (no per-tensor "
       "decode factor) or a finite positive number"},
      {"missing_dependency", "libqrecipe_needsdep.so", "libqrecipe_test_missing_dep.so"},
  };
  for (const auto& c : cases) {
    const std::string dir = c.dir;
    CAPTURE(dir);
    Registry r(only({broken_dir(c.dir), broken_dir("good")}));
    const LoadFailure& f = single_failure(r);
    CHECK(contains(f.path, c.file));
    CHECK_MESSAGE(contains(f.cause, c.expected), f.cause);
  }
}

TEST_CASE("a plugin built before the fields appended after v1 still loads, without them") {
  Registry r(only({broken_dir("v1_descriptor")}));
  REQUIRE(r.failures().empty());
  const FormatPlugin& old = r.get("oldtoy");
  // Its descriptor ends before tensor_scale_numerator: no per-tensor decode factor, whatever
  // the bytes after it hold.
  CHECK(old.tensor_scale_numerator() == 0.0f);
  CHECK(old.c().struct_size == QR_PLUGIN_DESCRIPTOR_SIZE_V1);
  // And a current plugin without the factor says 0 itself.
  Registry good(only({broken_dir("good")}));
  CHECK(good.get("toy").c().struct_size == sizeof(qr_plugin_descriptor));
  CHECK(good.get("toy").tensor_scale_numerator() == 0.0f);
}

TEST_CASE("a missing dependency is named as such") {
  Registry r(only({broken_dir("missing_dependency")}));
  REQUIRE(r.failures().size() == 1);
  CHECK(contains(r.failures()[0].cause, "a library it depends on could not be loaded"));
}

TEST_CASE("a missing path is reported, not fatal") {
  Registry r(only({"/nonexistent/qrecipe/plugins", broken_dir("good")}));
  const LoadFailure& f = single_failure(r);
  CHECK(f.path == "/nonexistent/qrecipe/plugins");
  CHECK(contains(f.cause, "no such file or directory"));
  // An explicit file that does not exist.
  CHECK(r.load_file("/nonexistent/libqrecipe_x.so") == nullptr);
  CHECK(contains(r.failures().back().cause, "no such file"));
}

TEST_CASE("the same format found twice: first in search order wins, the other is reported") {
  Registry r(only({broken_dir("good"), broken_dir("duplicate")}));
  CHECK(r.failures().empty());
  REQUIRE(r.duplicates().size() == 1);
  const DuplicateFormat& d = r.duplicates()[0];
  CHECK(d.format == "toy");
  CHECK(contains(d.used_path, "/good/"));
  CHECK(contains(d.ignored_path, "/duplicate/"));
  CHECK(contains(r.get("toy").path(), "/good/"));
  CHECK(r.plugins().size() == 1);
}

TEST_CASE("two different files claiming one format name is an error naming both") {
  Registry r(only({broken_dir("good"), broken_dir("renamed")}));
  REQUIRE(r.failures().size() == 1);
  CHECK(contains(r.failures()[0].path, "libqrecipe_toy_copy.so"));
  CHECK(contains(r.failures()[0].cause, "already provided by"));
  CHECK(contains(r.failures()[0].cause, "libqrecipe_toy.so"));
}

TEST_CASE("the same directory twice loads each plugin once") {
  Registry r(only({broken_dir("good"), broken_dir("good")}));
  CHECK(r.failures().empty());
  CHECK(r.duplicates().empty());
  CHECK(r.plugins().size() == 1);
}

TEST_CASE("unknown format lists the loaded ones and the failures") {
  Registry r(only({broken_dir("good"), broken_dir("wrong_abi")}));
  try {
    r.get("nope");
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(contains(msg, "unknown format 'nope'"));
    CHECK(contains(msg, "loaded formats: toy"));
    CHECK(contains(msg, "libqrecipe_wrongabi.so"));
    CHECK(contains(msg, "qrecipe plugins -v"));
  }
}

TEST_CASE("a throwing factory is an error when the quantizer is made; the engine survives") {
  auto r = std::make_shared<Registry>(only({broken_dir("throwing_factory")}));
  REQUIRE(r->failures().empty());
  QuantizerSpec spec;
  spec.format = "toy";
  Engine engine(Recipe::uniform(spec), r);
  const QuantizerRole role{"linear", "input", "x"};
  try {
    engine.resolve(role);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "toy factory failed on purpose"));
    CHECK(contains(e.what(), "creating a 'toy' quantizer"));
    CHECK(contains(e.what(), "linear:input@x"));
  }
  // The engine still answers (and still refuses) without crashing.
  CHECK_THROWS_AS(engine.resolve(role), Error);
}

TEST_CASE("search path order: api, QRECIPE_PLUGIN_PATH, install dir, engine library dir") {
  setenv("QRECIPE_PLUGIN_PATH", (broken_dir("duplicate") + ":" + broken_dir("nothing_here")).c_str(), 1);
  RegistryOptions o;
  o.paths = {broken_dir("good")};
  Registry r(o);
  const auto& sp = r.search_path();
  REQUIRE(sp.size() >= 3);
  CHECK(sp[0].origin == "api");
  CHECK(sp[1].origin == "QRECIPE_PLUGIN_PATH");
  CHECK(sp[2].origin == "QRECIPE_PLUGIN_PATH");
  CHECK(sp.back().origin == "engine library dir");
  // api first: the good directory's toy wins over the env's duplicate.
  CHECK(contains(r.get("toy").path(), "/good/"));
  REQUIRE(r.duplicates().size() == 1);
  unsetenv("QRECIPE_PLUGIN_PATH");
}

TEST_CASE("quantize through a loaded plugin, and device checks happen before the plugin") {
  auto r = std::make_shared<Registry>(only({broken_dir("good")}));
  QuantizerSpec spec;
  spec.format = "toy";
  Engine engine(Recipe::uniform(spec), r);
  auto q = engine.resolve({"linear", "weight", "w"});
  REQUIRE(q != nullptr);
  CHECK(engine.resolve({"linear", "weight", "w"}) == q);  // cached per role
  float data[6] = {1, 2, 3, 4, 5, 6};
  const TensorView x(data, DType::f32, {2, 3});
  const QuantizedTensor t = q->quantize(x, QR_USAGE_ROWWISE);
  CHECK(t.rows() == 2);
  CHECK(t.cols() == 3);
  const Tensor back = q->dequantize(t, QR_DIRECTION_ROWWISE);
  for (int i = 0; i < 6; ++i) CHECK(back.data_as<float>()[i] == data[i]);
  // A CUDA view is refused by the engine (the toy plugin is CPU only): no silent fallback.
  const TensorView on_gpu(data, DType::f32, {2, 3}, Device::cuda(0));
  try {
    q->quantize(on_gpu, QR_USAGE_ROWWISE);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == QR_STATUS_UNSUPPORTED);
    CHECK(contains(e.what(), "supports cpu only"));
  }
  // Wrong source dtype.
  std::uint8_t bytes[6] = {};
  CHECK_THROWS_WITH_AS(q->quantize(TensorView(bytes, DType::u8, {2, 3}), QR_USAGE_ROWWISE),
                       doctest::Contains("source dtype must be f32, bf16 or f16, got u8"), Error);
  // A plugin error comes back as an Error with the plugin's message and the context.
  std::uint16_t halfs[6] = {};
  CHECK_THROWS_WITH_AS(q->quantize(TensorView(halfs, DType::bf16, {2, 3}), QR_USAGE_ROWWISE),
                       doctest::Contains("toy takes contiguous f32"), Error);
}
