// Plugin-wide checks, run once per suite: the option schema and its validation through the
// engine (validate_spec), and the devices the plugin declares.
#include <cmath>
#include <set>

#include "detail.hpp"
#include "qrecipe/recipe.hpp"

namespace qrecipe::conformance::detail {
namespace {

bool bounded(const OptionSchema& o) { return !(o.min_value == 0.0 && o.max_value == 0.0); }

// The spec every option check starts from: the required options of the format, taken from
// the suite's first case (a format with a required option must give one), and nothing else.
QuantizerSpec base_spec(const Suite& suite, const FormatPlugin& plugin) {
  QuantizerSpec base;
  base.format = suite.format;
  for (const OptionSchema& o : plugin.options()) {
    if (!o.required) continue;
    const OptionValue* v = suite.cases.empty() ? nullptr : suite.cases.front().spec.find(o.key);
    REQUIRE_MESSAGE(v != nullptr, "format '" << suite.format << "' requires option '" << o.key
                                             << "': give it in the suite's first case");
    base.options.emplace_back(o.key, *v);
  }
  return base;
}

// `base` with `key` set to `value` (replacing any value it had).
QuantizerSpec with_option(QuantizerSpec base, const std::string& key, OptionValue value) {
  std::erase_if(base.options, [&](const auto& kv) { return kv.first == key; });
  base.options.emplace_back(key, std::move(value));
  return base;
}

// validate_spec must reject `s` with an error naming `key` (and `also`, if given).
void expect_rejected(const QuantizerSpec& s, const Registry& registry, const std::string& key,
                     const std::string& shown, const std::string& also = "") {
  try {
    validate_spec(s, registry);
    FAIL_CHECK("validate_spec accepted " << key << " = " << shown << " for format '" << s.format
                                         << "'; the option schema should make it an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(msg.find(key) != std::string::npos,
                  "rejecting " << key << " = " << shown << " must name the key; got: " << msg);
    if (!also.empty())
      CHECK_MESSAGE(msg.find(also) != std::string::npos, "rejecting " << key << " = " << shown
                                                                      << " should name '" << also
                                                                      << "'; got: " << msg);
  }
}

void expect_accepted(const QuantizerSpec& s, const Registry& registry, const std::string& key,
                     const std::string& text) {
  attempt("validate_spec of " + key + " = " + text, [&] { validate_spec(s, registry); });
}

}  // namespace

void check_options(const Suite& suite, const Registry& registry) {
  const FormatPlugin& plugin = registry.get(suite.format);
  const std::string& f = suite.format;

  // The schema is well formed.
  std::set<std::string> keys;
  for (const OptionSchema& o : plugin.options()) {
    INFO("option '" << o.key << "' of format '" << f << "'");
    CHECK_MESSAGE(!o.key.empty(), "an option has an empty key");
    CHECK_MESSAGE(keys.insert(o.key).second, "the key is declared twice");
    CHECK_MESSAGE(!o.help.empty(), "the option has no help text");
    CHECK_MESSAGE((o.type >= QR_OPTION_BOOL && o.type <= QR_OPTION_QUANTIZER),
                  "unknown option type " << o.type);
    if (o.type == QR_OPTION_ENUM) {
      CHECK_MESSAGE(!o.choices.empty(), "an enum without choices");
      std::set<std::string> choices(o.choices.begin(), o.choices.end());
      CHECK_MESSAGE(choices.size() == o.choices.size(), "an enum choice is listed twice");
    }
    if (o.type == QR_OPTION_INT || o.type == QR_OPTION_FLOAT)
      CHECK_MESSAGE(o.min_value <= o.max_value, "min " << o.min_value << " > max " << o.max_value);
  }

  const QuantizerSpec base = base_spec(suite, plugin);
  auto set = [&](const std::string& key, OptionValue v) { return with_option(base, key, std::move(v)); };
  auto text = [&](const std::string& key, const std::string& t) {
    return with_option(base, key, OptionValue::of_string(t));
  };

  // An unknown key.
  expect_rejected(set("no_such_option_for_conformance", OptionValue::of_string("1")), registry,
                  "no_such_option_for_conformance", "1");
  // Each required option left out.
  for (const OptionSchema& o : plugin.options()) {
    if (!o.required) continue;
    QuantizerSpec without = base;
    std::erase_if(without.options, [&](const auto& kv) { return kv.first == o.key; });
    expect_rejected(without, registry, o.key, "(missing)", "requires option");
  }

  // A bad value of every option: recipe text that does not parse as the type, a value typed
  // in code with the wrong type, and out-of-range numbers.
  for (const OptionSchema& o : plugin.options()) {
    INFO("option '" << o.key << "' (" << o.type_name() << ") of format '" << f << "'");
    const std::string& k = o.key;
    auto expect_rejected_kv = [&](const std::string& key, OptionValue v, const std::string& shown,
                                  const std::string& also = "") {
      expect_rejected(set(key, std::move(v)), registry, key, shown, also);
    };
    switch (o.type) {
      case QR_OPTION_BOOL:
        expect_rejected_kv(k, OptionValue::of_string("maybe"), "'maybe'");
        expect_rejected_kv(k, OptionValue::of_int(2), "2 (an int)");
        expect_accepted(text(k, "true"), registry, k, "true");
        expect_accepted(text(k, "false"), registry, k, "false");
        break;
      case QR_OPTION_INT:
        expect_rejected_kv(k, OptionValue::of_string("abc"), "'abc'");
        expect_rejected_kv(k, OptionValue::of_string("1.5"), "'1.5'");
        expect_rejected_kv(k, OptionValue::of_bool(true), "true (a bool)");
        if (bounded(o) && o.max_value < 9.0e18)
          expect_rejected_kv(k, OptionValue::of_int(static_cast<std::int64_t>(o.max_value) + 1),
                          "max + 1");
        if (bounded(o) && o.min_value > -9.0e18)
          expect_rejected_kv(k, OptionValue::of_int(static_cast<std::int64_t>(o.min_value) - 1),
                          "min - 1");
        break;
      case QR_OPTION_FLOAT:
        expect_rejected_kv(k, OptionValue::of_string("abc"), "'abc'");
        expect_rejected_kv(k, OptionValue::of_bool(true), "true (a bool)");
        expect_rejected_kv(k, OptionValue::of_float(NAN), "NaN");
        if (bounded(o) && std::isfinite(o.max_value))
          expect_rejected_kv(k, OptionValue::of_float(o.max_value + 1.0 + std::fabs(o.max_value)),
                          "above max");
        if (bounded(o) && std::isfinite(o.min_value))
          expect_rejected_kv(k, OptionValue::of_float(o.min_value - 1.0 - std::fabs(o.min_value)),
                          "below min");
        break;
      case QR_OPTION_ENUM:
        expect_rejected_kv(k, OptionValue::of_string("not-a-choice"), "'not-a-choice'",
                        o.choices.empty() ? "" : o.choices.front());
        expect_rejected_kv(k, OptionValue::of_int(0), "0 (an int)");
        for (const std::string& choice : o.choices) expect_accepted(text(k, choice), registry, k, choice);
        break;
      case QR_OPTION_STRING:
        expect_rejected_kv(k, OptionValue::of_spec(spec("none")), "a nested spec");
        break;
      case QR_OPTION_QUANTIZER:
        expect_rejected_kv(k, OptionValue::of_string("not-a-spec"), "'not-a-spec'");
        expect_rejected_kv(k, OptionValue::of_int(1), "1 (an int)");
        break;
      default: break;
    }
  }
}

void check_devices(const Suite& suite, const Registry& registry) {
  const FormatPlugin& plugin = registry.get(suite.format);
  CHECK(plugin.name() == suite.format);
  CHECK_MESSAGE(!plugin.version().empty(), "the plugin descriptor has no version");
  CHECK_MESSAGE(plugin.supports(Device::cpu()),
                "plugin " << plugin.path() << " does not declare the CPU; every plugin carries "
                          << "its CPU reference (docs/plugins.md, \"The conformance suite\"), "
                          << "which this suite tests");
  if (!plugin.supports(Device::cuda()))
    not_supported(suite.format + ": CUDA tensors (plugin " + plugin.path() +
                  " was built without CUDA; devices: " + plugin.devices_str() + ")");
  else
    not_supported(suite.format + ": CUDA tensors in this suite (the plugin accepts them" +
                  (plugin.cuda_version() ? ", built with CUDA " +
                                               std::to_string(plugin.cuda_version()) + " for SM " +
                                               plugin.cuda_archs()
                                         : std::string()) +
                  "; the suite runs CPU tensors, the GPU test script checks CUDA == CPU)");
}

}  // namespace qrecipe::conformance::detail
