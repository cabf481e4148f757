#!/usr/bin/env bash
# video_bench.sh [FILE] [SECONDS]: decode throughput of vlafeed's video layer
# next to the ffmpeg CLI on the same file, in the same run, one thread each.
#
#   vlafeed: bench_video (sequential decode + RGB, random access with the
#            decoder reused, batches, conversion alone)
#   ffmpeg:  `ffmpeg -threads 1 -i FILE -f null -` (raw decode) and the same
#            with `-pix_fmt rgb24 -sws_flags bilinear` (decode + RGB)
#
# Prints each figure and the ratios vlafeed / ffmpeg, on frames per CPU
# second (so other load on a shared machine cancels out; wall-clock rates are
# printed too). FILE defaults to a fixture video; the build folder comes from
# $BUILD (default: build). Absolute numbers depend on the machine; the ratios
# are the result.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
file=${1:-$here/../shared/fixtures/lerobot-g1-v21/videos/chunk-000/observation.images.cam_high/episode_000001.mp4}
seconds=${2:-3}
build=${BUILD:-$here/build}
bench="$build/bench_video"
[ -x "$bench" ] || { echo "video_bench: $bench not built (cmake --build $build)" >&2; exit 2; }
command -v ffmpeg >/dev/null || { echo "video_bench: ffmpeg CLI not found" >&2; exit 2; }

frames=$(ffprobe -v error -select_streams v:0 -count_packets -show_entries stream=nb_read_packets -of csv=p=0 "$file")
codec=$(ffprobe -v error -select_streams v:0 -show_entries stream=codec_name -of csv=p=0 "$file")
decoder=()
[ "$codec" = "av1" ] && decoder=(-c:v libdav1d)   # FFmpeg 5.1's native av1 decoder needs hardware

ours=$("$bench" "$file" --seconds "$seconds")
echo "$ours"
value() { echo "$ours" | awk -v k="$1" '$1 == k { print $2 }'; }

# Loop the input so each CLI run lasts about as long as ours (~800 fps guess).
loops=$(( (seconds * 800 + frames - 1) / frames ))
cli() {  # cli ARGS... -> "frames/cpu-s frames/s-wall"
  local times wall user sys
  times=$( { TIMEFORMAT='%R %U %S'; time ffmpeg -hide_banner -v error -threads 1 "${decoder[@]}" \
             -stream_loop "$((loops - 1))" -i "$file" "$@" -f null - </dev/null >/dev/null 2>&1; } 2>&1 )
  read -r wall user sys <<< "$times"
  awk -v n="$((frames * loops))" -v w="$wall" -v c="$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')" \
      'BEGIN { printf "%.1f %.1f", n / c, n / w }'
}
read -r cli_raw cli_raw_wall <<< "$(cli)"
read -r cli_rgb cli_rgb_wall <<< "$(cli -pix_fmt rgb24 -sws_flags bilinear)"
echo "ffmpeg_cli_raw $cli_raw frames/cpu-s ($cli_raw_wall frames/s wall, $((frames * loops)) frames, -threads 1)"
echo "ffmpeg_cli_rgb $cli_rgb frames/cpu-s ($cli_rgb_wall frames/s wall, decode + rgb24 bilinear)"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo "ratio seq_rgb / cli_rgb        $(ratio "$(value seq_rgb)" "$cli_rgb")"
echo "ratio seq_rgb / cli_raw        $(ratio "$(value seq_rgb)" "$cli_raw")"
echo "ratio seq_chw_f32 / cli_rgb    $(ratio "$(value seq_chw_f32)" "$cli_rgb")"
echo "ratio random_rgb / cli_rgb     $(ratio "$(value random_rgb)" "$cli_rgb")"
echo "ratio batch64_rgb / cli_rgb    $(ratio "$(value batch64_rgb)" "$cli_rgb")"
echo "ratio random_reopen / random   $(ratio "$(value random_reopen)" "$(value random_rgb)")"
