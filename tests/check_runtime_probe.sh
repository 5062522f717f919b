#!/usr/bin/env bash
# The configure-time C++ runtime check (cmake/QrecipeRuntime.cmake) on the two set-ups that
# link libstdc++ statically (issue 23):
#   1. a compiler that finds only libstdc++.a (as a GCC unpacked into /opt/gcc does; simulated
#      by a wrapper whose library path has a directory holding only libstdc++.a): configure
#      notices, links the shared libstdc++ instead, and a library built there NEEDs it;
#   2. -static-libstdc++ in the linker flags: configure stops with a message that says why and
#      what to do;
#   3. and tests/check_library_exports.sh (ctest library_exports) rejects what the issue found,
#      a library with the runtime linked in statically and its std:: symbols exported, so that
#      check cannot pass by checking nothing.
#
#   check_runtime_probe.sh CXX QRECIPE_SOURCE_DIR WORK_DIR
set -uo pipefail
cxx=${1:?usage: check_runtime_probe.sh CXX QRECIPE_SOURCE_DIR WORK_DIR}
src=${2:?usage}
work=${3:?usage}
project=$src/tests/runtime_probe
rm -rf "$work" && mkdir -p "$work/static-only" || exit 1
status=0
fail() { echo "FAIL: $*"; status=1; }

archive=$("$cxx" -print-file-name=libstdc++.a)
if [[ $archive != /* || ! -f $archive ]]; then
  # Without the archive the compiler cannot link the runtime statically at all: nothing to check.
  echo "FAIL: $cxx has no libstdc++.a (-print-file-name says '$archive'); this test needs it to"\
       "build the static set-up it checks"
  exit 1
fi
ln -s "$archive" "$work/static-only/libstdc++.a"
# -L options apply to every -l wherever they stand, in order, before the compiler's own
# directories: this one wins over the compiler's libstdc++.so, as a lone libstdc++.a does.
cat >"$work/static-cxx" <<WRAP
#!/bin/sh
exec "$cxx" "\$@" -L"$work/static-only"
WRAP
chmod +x "$work/static-cxx"

echo "--- 1. a compiler that links libstdc++.a by default"
printf '#include <string>\nstd::string f(int n) { return std::to_string(n); }\n' >"$work/plain.cpp"
"$work/static-cxx" -shared -fPIC "$work/plain.cpp" -o "$work/plain.so" || exit 1
if readelf -d "$work/plain.so" | grep -q 'NEEDED.*libstdc++'; then
  fail "the wrapper compiler links the shared libstdc++ by itself, so case 1 would check nothing"
fi
if ! out=$(cmake -S "$project" -B "$work/fixed" -DCMAKE_CXX_COMPILER="$work/static-cxx" \
             -DQRECIPE_CMAKE_DIR="$src/cmake" 2>&1); then
  echo "$out"
  fail "configure failed with a compiler whose default is libstdc++.a (it should link the shared one)"
else
  grep 'qrecipe: C++ runtime' <<<"$out"
  grep -q 'the compiler alone linked libstdc++.a' <<<"$out" ||
    fail "configure did not notice that the compiler alone links libstdc++.a"
  if cmake --build "$work/fixed" >"$work/fixed.log" 2>&1; then
    lib=$(find "$work/fixed" -name 'libruntime_check.so' | head -n 1)
    if readelf -d "$lib" | grep -q 'NEEDED.*\[libstdc++\.so'; then
      echo "ok   a library built there NEEDs libstdc++.so"
    else
      fail "a library built after configure does not NEED libstdc++.so: $(readelf -d "$lib" | grep NEEDED | tr -s ' ')"
    fi
  else
    cat "$work/fixed.log"; fail "building the probe project failed"
  fi
fi

echo "--- 2. -static-libstdc++ in the linker flags"
out=$(cmake -S "$project" -B "$work/refused" -DCMAKE_CXX_COMPILER="$cxx" \
        -DQRECIPE_CMAKE_DIR="$src/cmake" -DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++ 2>&1)
rc=$?
if ((rc == 0)); then
  fail "configure accepted -static-libstdc++"
elif ! grep -q 'the C++ runtime would be linked statically' <<<"$out" ||
     ! grep -q 'remove -static-libstdc++' <<<"$out"; then
  echo "$out"; fail "configure failed (exit $rc) without saying that the runtime would be static and what to do"
else
  echo "ok   configure refused, exit $rc: $(grep -m1 -o 'the C++ runtime would be linked statically[^.]*' <<<"$out")"
fi
echo "--- 3. check_library_exports.sh on a library with a static runtime"
# plain.so (case 1's sanity build): libstdc++.a linked in, default visibility. As a plugin.
cp "$work/plain.so" "$work/libqrecipe_static.so"
out=$(bash "$src/tests/check_library_exports.sh" "$work/libqrecipe_static.so" 2>&1)
rc=$?
if ((rc != 1)) || ! grep -q 'does not NEED libstdc++.so' <<<"$out" ||
   ! grep -qE 'exports [0-9]+ symbols of the C\+\+ runtime' <<<"$out"; then
  echo "$out"; fail "check_library_exports.sh (exit $rc) did not report both the static runtime and its exported std:: symbols"
else
  echo "ok   check_library_exports.sh refused it, exit $rc:"
  grep '^FAIL' <<<"$out" | cut -c1-160 | sed 's/^/       /'
fi
((status == 0)) && echo "ok: the configure-time C++ runtime check links or refuses as it should"
exit $status
