// `qrecipe`: the command-line face of the engine.
//
//   qrecipe plugins [-v]                          formats found, options, load failures
//   qrecipe recipe check FILE [--module TYPE:NAME ...]
//                                                 validate a recipe (exit 0 or 1); with modules,
//                                                 also warn of rules that match none of them and
//                                                 of roles a rule nearly covers
//   qrecipe recipe explain FILE --module TYPE:NAME[:IN:OUT] ... [--tokens N] [--device cpu|sm90]
//                                                 the quantizer every role of those modules gets,
//                                                 and how each GEMM runs on that device
//   qrecipe quantize --format F [--option k=v]... [--shape RxC] [--seed N] [--tensor-type T]
//                                                 quantize random data on the CPU, print errors
//
// Exit codes: 0 success, 1 the request failed (invalid recipe, quantize error), 2 bad usage.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "args.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"

namespace {

using namespace qrecipe;

constexpr const char* kUsage =
    "usage:\n"
    "  qrecipe plugins [-v]\n"
    "  qrecipe recipe check FILE [--module TYPE:NAME ...]\n"
    "  qrecipe recipe explain FILE --module TYPE:NAME[:IN:OUT] [--module ...]\n"
    "                         [--tokens N] [--device cpu|sm90]\n"
    "  qrecipe quantize --format FORMAT [--option KEY=VALUE ...] [--shape ROWSxCOLS]\n"
    "                   [--seed N] [--tensor-type input|weight|grad_output]\n"
    "                   (at most 2^30 elements: the data is made and quantized in memory)\n";

using cli::parse_positive;
using cli::parse_shape;
using cli::UsageError;

int cmd_plugins(const std::vector<std::string>& args) {
  bool verbose = false;
  for (const auto& a : args) {
    if (a == "-v" || a == "--verbose") verbose = true;
    else throw UsageError("unknown argument '" + printable(a) + "' for `qrecipe plugins`");
  }
  const auto registry = Registry::shared();
  if (verbose) {
    std::cout << "plugin search path (first match wins):\n";
    int i = 1;
    for (const auto& e : registry->search_path())
      std::cout << "  " << i++ << ". " << e.path << "  [" << e.origin << "]\n";
    std::cout << "\n";
  }
  std::cout << "formats (" << registry->plugins().size() << "):\n";
  for (const auto& p : registry->plugins()) {
    std::cout << "  " << p->name() << " " << p->version() << "  devices: " << p->devices_str();
    if (p->cuda_version() != 0)
      std::cout << "  (CUDA " << p->cuda_version() / 1000 << "." << (p->cuda_version() % 1000) / 10
                << ", sm " << p->cuda_archs() << ")";
    std::cout << "\n    " << p->description() << "\n";
    if (verbose) std::cout << "    file: " << p->path() << "\n";
    std::cout << "    options:\n";
    if (p->options().empty()) std::cout << "      (none)\n";
    for (const auto& o : p->options()) std::cout << "      " << o.describe() << "\n";
  }
  for (const auto& d : registry->duplicates())
    std::cout << "note: format '" << d.format << "' found twice; using " << d.used_path
              << ", ignoring " << d.ignored_path << "\n";
  if (!registry->failures().empty()) {
    std::cout << "load failures (" << registry->failures().size() << "):\n";
    for (const auto& f : registry->failures()) std::cout << "  " << f.path << ": " << f.cause << "\n";
  }
  return 0;
}

struct ModuleArg {
  std::string type, name;
  std::int64_t in_features = 1024, out_features = 1024;
};
ModuleArg parse_module(const std::string& s);

// The three roles of each module given.
std::vector<QuantizerRole> roles_of(const std::vector<ModuleArg>& modules) {
  std::vector<QuantizerRole> roles;
  for (const auto& m : modules)
    for (const auto tensor_type : kTensorTypes)
      roles.push_back({m.type, std::string(tensor_type), m.name});
  return roles;
}

int cmd_recipe_check(const std::vector<std::string>& args) {
  std::string file;
  std::vector<ModuleArg> modules;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--module") {
      if (i + 1 >= args.size()) throw UsageError("--module needs a value");
      modules.push_back(parse_module(args[++i]));
    } else if (file.empty()) {
      file = args[i];
    } else {
      throw UsageError("`qrecipe recipe check` takes one FILE (and --module TYPE:NAME ...); "
                       "unexpected '" + args[i] + "'");
    }
  }
  if (file.empty()) throw UsageError("`qrecipe recipe check` needs a recipe FILE");
  const Recipe recipe = Recipe::load(file);
  const auto errors = recipe.check(*Registry::shared());
  for (const auto& e : errors) std::cerr << "error: " << e.what() << "\n";
  if (!errors.empty()) {
    std::cerr << file << ": " << errors.size() << " problem(s)\n";
    return 1;
  }
  // Warnings say what the recipe does to these modules that its author may not mean; they do
  // not fail the check.
  const auto warnings = recipe.coverage(roles_of(modules));
  for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
  std::cout << file << ": ok (recipe '" << recipe.name() << "', " << recipe.rules().size()
            << " rules";
  if (!modules.empty())
    std::cout << "; " << modules.size() << " module(s), " << warnings.size() << " warning(s)";
  std::cout << ")\n";
  return 0;
}

// "linear:layers.0.fc1[:IN:OUT]" -> {linear, layers.0.fc1, IN, OUT}
ModuleArg parse_module(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == ':') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  if ((parts.size() != 2 && parts.size() != 4) || parts[0].empty())
    throw UsageError("--module expects TYPE:NAME or TYPE:NAME:IN:OUT (e.g. linear:layers.0.fc1:4096:11008), got '" + printable(s) + "'");
  ModuleArg m{parts[0], parts[1]};
  if (parts.size() == 4) {
    m.in_features = parse_positive(parts[2], "--module IN");
    m.out_features = parse_positive(parts[3], "--module OUT");
  }
  return m;
}

int cmd_recipe_explain(const std::vector<std::string>& args) {
  std::string file;
  std::vector<ModuleArg> modules;
  std::int64_t tokens = 2048;
  GemmTarget target = GemmTarget::cpu;  // the device this process computes on
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const char* flag) {
      if (i + 1 >= args.size()) throw UsageError(std::string(flag) + " needs a value");
      return args[++i];
    };
    if (args[i] == "--module") {
      modules.push_back(parse_module(value("--module")));
    } else if (args[i] == "--tokens") {
      tokens = parse_positive(value("--tokens"), "--tokens");
    } else if (args[i] == "--device") {
      try {
        target = gemm_target_from_name(value("--device"));
      } catch (const Error& e) {
        throw UsageError(e.message());
      }
    } else if (file.empty()) {
      file = args[i];
    } else {
      throw UsageError("unexpected argument '" + printable(args[i]) + "'");
    }
  }
  if (file.empty()) throw UsageError("`qrecipe recipe explain` needs a recipe FILE");
  if (modules.empty()) throw UsageError("give at least one --module TYPE:NAME");
  Engine engine(Recipe::load(file), Registry::shared());
  const Recipe& recipe = engine.recipe();
  std::cout << "recipe '" << recipe.name() << "' (" << file << "), GEMMs planned for device "
            << gemm_target_name(target) << ", " << tokens << " tokens\n";
  for (const auto& m : modules) {
    std::cout << m.type << " " << m.name << " [" << m.in_features << " -> " << m.out_features
              << "]:\n";
    // A role a Python factory decides cannot be resolved here: say so, and plan nothing.
    bool delegated = false;
    for (const auto tensor_type : kTensorTypes) {
      const QuantizerRole role{m.type, std::string(tensor_type), m.name};
      const int rule = recipe.match(role);
      if (rule < 0 || !recipe.rules()[rule].delegates()) continue;
      delegated = true;
      std::cout << "  " << role.tensor_type << ": decided by the Python factory '"
                << recipe.rules()[rule].factory << "'  <- " << recipe.decider_str(role) << "\n";
    }
    if (delegated) {
      std::cout << "  (a factory runs in Python: `qrecipe.Recipe.load(FILE).explain(model)` "
                   "shows what it gives and how the GEMMs run)\n";
      continue;
    }
    const LinearPlan plan =
        engine.plan_linear(m.type, m.name, m.in_features, m.out_features, tokens, target);
    const std::pair<const QuantizerRole*, const std::shared_ptr<Quantizer>*> roles[] = {
        {&plan.input, &plan.input_q}, {&plan.weight, &plan.weight_q},
        {&plan.grad_output, &plan.grad_output_q}};
    for (const auto& [role, q] : roles)
      std::cout << "  " << role->tensor_type << ": "
                << (*q ? (*q)->describe() : "none (high precision)") << "  <- "
                << engine.origin(*role) << "\n";
    for (const auto* g : {&plan.fprop, &plan.dgrad, &plan.wgrad})
      std::cout << "  " << gemm_kind_name(g->kind) << " [" << g->m << "x" << g->n << "x" << g->k
                << "]: " << g->a.str() << " x " << g->b.str() << " -> " << g->plan.str() << "\n";
  }
  return 0;
}

int cmd_quantize(const std::vector<std::string>& args) {
  QuantizerSpec spec;
  spec.format.clear();
  std::int64_t rows = 1024, cols = 1024;
  std::uint64_t seed = 0;
  std::string tensor_type = "input";
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const char* flag) {
      if (i + 1 >= args.size()) throw UsageError(std::string(flag) + " needs a value");
      return args[++i];
    };
    if (args[i] == "--format") {
      spec.format = value("--format");
    } else if (args[i] == "--option") {
      const std::string kv = value("--option");
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        throw UsageError("--option expects KEY=VALUE, got '" + printable(kv) + "'");
      OptionValue v = OptionValue::of_string(kv.substr(eq + 1));
      v.location.file = "--option " + kv;
      spec.options.emplace_back(kv.substr(0, eq), std::move(v));
    } else if (args[i] == "--shape") {
      std::tie(rows, cols) = parse_shape(value("--shape"));
    } else if (args[i] == "--seed") {
      seed = cli::parse_unsigned(value("--seed"), "--seed");
    } else if (args[i] == "--tensor-type") {
      tensor_type = value("--tensor-type");
    } else {
      throw UsageError("unknown argument '" + printable(args[i]) + "' for `qrecipe quantize`");
    }
  }
  if (spec.format.empty()) throw UsageError("`qrecipe quantize` needs --format");
  if (spec.format == "none") throw UsageError("format none keeps high precision; nothing to quantize");

  Engine engine(Recipe::uniform(spec, "cli"), Registry::shared());
  const QuantizerRole role{"linear", tensor_type, "cli"};
  const auto q = engine.resolve(role);

  // Standard normal data (fixed seed: the same numbers on every machine with this libstdc++).
  Tensor x(DType::f32, {rows, cols});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float* xs = x.data_as<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) xs[i] = normal(rng);

  const QuantizedTensor qt = q->quantize(x.view(), QR_USAGE_ROWWISE);
  const Tensor y = q->dequantize(qt, QR_DIRECTION_ROWWISE);
  const float* ys = y.data_as<float>();
  double max_abs = 0, max_rel = 0, signal = 0, noise = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double err = std::fabs(static_cast<double>(xs[i]) - ys[i]);
    max_abs = std::max(max_abs, err);
    if (xs[i] != 0.0f) max_rel = std::max(max_rel, err / std::fabs(static_cast<double>(xs[i])));
    signal += static_cast<double>(xs[i]) * xs[i];
    noise += err * err;
  }
  const auto& d = qt.direction(QR_DIRECTION_ROWWISE);
  double bytes = static_cast<double>(TensorView(d.data).nbytes());
  if (d.scale_inv.data) bytes += static_cast<double>(TensorView(d.scale_inv).nbytes());
  if (d.amax.data) bytes += 4;
  const double numel = static_cast<double>(std::max<std::int64_t>(x.numel(), 1));
  std::printf("quantizer      %s\n", q->describe().c_str());
  std::printf("shape          %lldx%lld, standard normal, seed %llu\n",
              static_cast<long long>(rows), static_cast<long long>(cols),
              static_cast<unsigned long long>(seed));
  std::printf("max abs error  %.6g\n", max_abs);
  std::printf("max rel error  %.6g\n", max_rel);
  std::printf("SNR            %.2f dB\n", noise > 0 ? 10.0 * std::log10(signal / noise) : INFINITY);
  std::printf("bytes/element  %.4f (data + scales, rowwise)\n", bytes / numel);
  return 0;
}

int dispatch(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "-h" || argv[0] == "--help" || argv[0] == "help") {
    std::cout << kUsage;
    return argv.empty() ? 2 : 0;
  }
  const std::string& cmd = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (cmd == "plugins") return cmd_plugins(rest);
  if (cmd == "quantize") return cmd_quantize(rest);
  if (cmd == "recipe") {
    if (rest.empty()) throw UsageError("`qrecipe recipe` needs a subcommand: check or explain");
    const std::vector<std::string> sub(rest.begin() + 1, rest.end());
    if (rest[0] == "check") return cmd_recipe_check(sub);
    if (rest[0] == "explain") return cmd_recipe_explain(sub);
    throw UsageError("unknown subcommand `qrecipe recipe " + printable(rest[0]) + "`");
  }
  throw UsageError("unknown command '" + printable(cmd) + "'");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    std::cerr << "qrecipe: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
