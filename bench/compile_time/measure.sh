#!/usr/bin/env bash
# How long a trainer's translation unit that uses hivemesh takes to compile: the README's RPC
# snippet (readme_rpc.cpp beside this script), header-only, in the compiled mode
# (HIVEMESH_SEPARATE_COMPILATION: what src/*.cpp compiles once then comes from
# hivemesh::compiled), and in the compiled mode with <hivemesh/hivemesh.hpp> precompiled;
# with a file that includes only <asio.hpp> and one that includes only
# <hivemesh/hivemesh.hpp> for scale. Each is compiled with -O2 -c, RUNS times; the median
# CPU time (user + system) is reported, as a table and as one JSON object per line. On an
# idle machine it is the wall time; on a busy one it is still the compiler's own cost.
#   usage: measure.sh [compiler (default g++)] [runs (default 3)]
# The compiled mode's program is also linked and run when BUILD_DIR names a build tree
# holding libhivemesh_compiled.a (so the numbers are of a TU that really works).
set -euo pipefail
cd "$(dirname "$0")"
compiler=${1:-g++}
runs=${2:-3}
root=$(cd ../.. && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-std=c++20 -O2 -I"$root/include" -DASIO_STANDALONE -DASIO_NO_DEPRECATED
       -DASIO_HAS_CO_AWAIT=1 -DASIO_HAS_STD_COROUTINE=1)
echo '#include <asio.hpp>' > "$work/asio_only.cpp"
echo '#include <hivemesh/hivemesh.hpp>' > "$work/include_only.cpp"

median_seconds() { # source, extra flags...
  local source=$1
  shift
  local times=()
  for _ in $(seq "$runs"); do
    /usr/bin/time -o "$work/time" -f '%U %S' \
      "$compiler" "${flags[@]}" "$@" -c "$source" -o "$work/out.o"
    times+=("$(awk '{print $1 + $2}' "$work/time")")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p"
}

printf '%-44s %8s\n' "translation unit ($compiler -O2, median of $runs)" "CPU s"
report() { # name, source, extra flags...
  local name=$1
  shift
  local seconds
  seconds=$(median_seconds "$@")
  printf '%-44s %8.1f\n' "$name" "$seconds"
  echo "{\"tu\": \"$name\", \"compiler\": \"$compiler\", \"runs\": $runs, \"cpu_seconds\": $seconds}" \
    >> "$work/json"
}
report "<asio.hpp> only" "$work/asio_only.cpp"
report "<hivemesh/hivemesh.hpp> only, header-only" "$work/include_only.cpp"
report "README RPC snippet, header-only" readme_rpc.cpp
report "README RPC snippet, compiled mode" readme_rpc.cpp -DHIVEMESH_SEPARATE_COMPILATION

# The same with <hivemesh/hivemesh.hpp> precompiled (what CMake's target_precompile_headers
# does): the header is parsed once per target, not once per translation unit.
pch_flags=(-DHIVEMESH_SEPARATE_COMPILATION)
mkdir -p "$work/pch"
echo '#include <hivemesh/hivemesh.hpp>' > "$work/pch/all.hpp"
pch_build_flags=()
if [[ "$compiler" == *clang* ]]; then
  pch="$work/pch/all.hpp.pch"
  pch_flags+=(-include-pch "$pch")
  # As CMake does for clang: the header's pending template instantiations are done once, in
  # the PCH, instead of in every translation unit that uses it.
  pch_build_flags+=(-Xclang -fpch-instantiate-templates)
else
  pch="$work/pch/all.hpp.gch" # g++ takes it in place of all.hpp
  pch_flags+=(-include "$work/pch/all.hpp" -Winvalid-pch)
fi
/usr/bin/time -o "$work/time" -f '%U %S' "$compiler" "${flags[@]}" -DHIVEMESH_SEPARATE_COMPILATION \
  "${pch_build_flags[@]}" -x c++-header "$work/pch/all.hpp" -o "$pch"
seconds=$(awk '{print $1 + $2}' "$work/time")
printf '%-44s %8.1f\n' "(the precompiled header, once per target)" "$seconds"
echo "{\"tu\": \"precompiled header\", \"compiler\": \"$compiler\", \"runs\": 1, \"cpu_seconds\": $seconds}" \
  >> "$work/json"
report "README RPC snippet, compiled mode + PCH" readme_rpc.cpp "${pch_flags[@]}"
cat "$work/json"

if [ -n "${BUILD_DIR:-}" ]; then
  "$compiler" "${flags[@]}" -DHIVEMESH_SEPARATE_COMPILATION readme_rpc.cpp \
    "$BUILD_DIR/libhivemesh_compiled.a" -lsodium -lzstd -lxxhash -pthread -o "$work/readme_rpc"
  "$work/readme_rpc"
fi
