#!/usr/bin/env bash
# Every library qrecipe builds links the shared C++ runtime and exports only its own API, so
# it never carries a private runtime (or private copies of yaml-cpp, Boost, the CUDA runtime)
# that could clash with the copies a host process such as torch already holds (issue 23: a
# pip-built libqrecipe.so with the C++ runtime linked in statically crashed at the first GEMM).
#
#   check_library_exports.sh PATH...   (a directory: its libqrecipe*.so and _C*.so; or files)
#
# For each library, from `readelf -d` and `nm -D --defined-only`:
#   - it NEEDs libstdc++.so (the C++ runtime is linked dynamically);
#   - it defines and exports nothing of std::, __gnu_cxx::, YAML:: or boost:: (typeinfo,
#     vtables and guard variables included), nor the C++ ABI or unwinder (__cxa_*, __gxx_*,
#     _Unwind_*), nor the CUDA runtime (cuda*, __cuda*);
#   - what it exports is its API only:
#       libqrecipe.so      qrecipe:: (and the typeinfo / vtables of qrecipe:: types), but none
#                          of the engine's internals (cmake/libqrecipe.version says which)
#       libqrecipe_*.so    exactly qrecipe_plugin_abi and qrecipe_plugin_entry (a plugin)
#       _C*.so             exactly PyInit__C (the Python extension)
# Exit status: 0 when every library passes, 1 otherwise (every problem listed), 2 on bad usage.
set -uo pipefail
if (($# == 0)); then
  echo "usage: check_library_exports.sh PATH..." >&2
  exit 2
fi
for tool in readelf nm awk; do
  command -v "$tool" >/dev/null || { echo "check_library_exports.sh: $tool not found (binutils)" >&2; exit 2; }
done

libs=()
for path in "$@"; do
  if [[ -d $path ]]; then
    shopt -s nullglob
    libs+=("$path"/libqrecipe*.so "$path"/_C*.so)
    shopt -u nullglob
  elif [[ -f $path ]]; then
    libs+=("$path")
  else
    echo "check_library_exports.sh: no such file or directory: $path" >&2
    exit 2
  fi
done
if ((${#libs[@]} == 0)); then
  echo "FAIL: no libqrecipe*.so or _C*.so in: $*"
  exit 1
fi

# Exported names, mangled, one per line. Ownership is read from the mangled name, whose
# qualified name comes first (a demangled function template starts with its return type).
exported() { nm -D --defined-only "$1" | awk '{print $NF}'; }
demangle() { c++filt 2>/dev/null || cat; }

# The front of a mangled C++ name up to its first namespace: special names (typeinfo, typeinfo
# name, vtable, VTT, guard variable, TLS init/wrapper, thunks, construction vtable), a local
# entity's enclosing function (Z), a nested name (N) with its qualifiers.
front='^_Z(T[VTIS]|GV|TH|TW|Th?n?[0-9]+_|Tvn?[0-9]+_n?[0-9]+_|TC)?Z?N?[rVK]*[RO]?'
# Owned by the C++ runtime or a dependency: std:: (St, and the abbreviations Sa Sb Ss Si So Sd),
# __gnu_cxx::, __cxxabiv1::, YAML::, boost::; C names of the C++ ABI, the unwinder, CUDA's runtime.
foreign="$front(St|S[absiod]|9__gnu_cxx|10__cxxabiv1|4YAML|5boost)|^(__cxa_|__gxx_|_Unwind_|__cuda|cuda)"
qrecipe_api="${front}7qrecipe"
# Engine internals (declared in engine/src headers): hidden at compile time, see
# cmake/libqrecipe.version.
internal="${front}7qrecipe(8cublaslt|15recipe_internal|6detail(12gemm_kernels|11DeviceGuard|18DeviceScalingTable|8gemm_cpu|9gemm_cuda|7grouped|11host_groups|13host_operands|12host_outputs|14gemm_per_group|14grouped_traits|17gemm_grouped_cuda|21grouped_kernels_built|21grouped_kernel_writes|19grouped_kernel_name|21native_grouped_kernel))"

status=0
fail() { echo "FAIL $1: $2"; status=1; }

for lib in "${libs[@]}"; do
  name=$(basename "$lib")
  ok=1
  if ! readelf -d "$lib" | grep -Eq 'NEEDED.*\[libstdc\+\+\.so'; then
    fail "$name" "does not NEED libstdc++.so: the C++ runtime was linked in statically (readelf -d shows: $(readelf -d "$lib" | grep NEEDED | sed -E 's/.*\[(.*)\]/\1/' | tr '\n' ' '))"
    ok=0
  fi
  symbols=$(exported "$lib")
  bad=$(grep -E "$foreign" <<<"$symbols")
  if [[ -n $bad ]]; then
    fail "$name" "exports $(grep -c . <<<"$bad") symbols of the C++ runtime, yaml-cpp, Boost or the CUDA runtime, e.g.:"
    head -n 5 <<<"$bad" | demangle | sed 's/^/       /'
    ok=0
  fi
  case $name in
    libqrecipe.so)
      bad=$(grep -vE "$qrecipe_api" <<<"$symbols" | grep -vE "$foreign" | grep -v '^$')
      if [[ -n $bad ]]; then
        fail "$name" "exports $(grep -c . <<<"$bad") symbols outside qrecipe's API, e.g.:"
        head -n 5 <<<"$bad" | demangle | sed 's/^/       /'
        ok=0
      fi
      bad=$(grep -E "$internal" <<<"$symbols")
      if [[ -n $bad ]]; then
        fail "$name" "exports $(grep -c . <<<"$bad") engine internals (declared in engine/src headers), e.g.:"
        head -n 5 <<<"$bad" | demangle | sed 's/^/       /'
        ok=0
      fi
      ;;
    libqrecipe_*.so)
      all=$(sort <<<"$symbols" | tr '\n' ' ')
      if [[ $all != "qrecipe_plugin_abi qrecipe_plugin_entry " ]]; then
        fail "$name" "a plugin exports exactly qrecipe_plugin_abi and qrecipe_plugin_entry; got: $all"
        ok=0
      fi
      ;;
    _C*.so)
      all=$(sort <<<"$symbols" | tr '\n' ' ')
      if [[ $all != "PyInit__C " ]]; then
        fail "$name" "the Python extension exports exactly PyInit__C; got $(wc -l <<<"$symbols") symbols: $(head -c 300 <<<"$all")"
        ok=0
      fi
      ;;
  esac
  ((ok)) && echo "ok   $name: NEEDs libstdc++, exports $(grep -c . <<<"$symbols") API symbols"
done
exit $status
