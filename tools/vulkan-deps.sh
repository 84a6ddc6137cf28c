#!/usr/bin/env bash
# What ggml's Vulkan backend needs to build and run (`make setup-vulkan`): the Vulkan loader, glslc (ggml
# compiles its compute shaders with it at build time) and Mesa's drivers, whose lavapipe ("llvmpipe") is a
# Vulkan device on the CPU, so the device tests run on a machine without a GPU.
#
# On Debian 12 the Vulkan headers (1.3.239) are too old for ggml 0.15.3's Vulkan backend. Debian 13's
# libvulkan-dev and spirv-headers are header packages (plus a loader symlink), so they are downloaded with
# a private apt configuration naming trixie and unpacked into build/vulkan-headers/, never installed: the
# system keeps Debian 12's loader and every other package at its Debian 12 version.
# Prints the prefix holding those headers (an empty line on Debian 13, where the system packages are new
# enough) as its last line of stdout; the Makefile hands it to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."

. /etc/os-release
major=${VERSION_ID:-14}  # testing and sid name no VERSION_ID: newer than 13
major=${major%%.*}
PACKAGES=(libvulkan1 glslc mesa-vulkan-drivers)
[ "$major" -ge 13 ] && PACKAGES+=(libvulkan-dev spirv-headers)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "ggml's Vulkan backend needs these Debian packages; install them with:" >&2
    echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  echo "Installing system packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

[ "$major" -ge 13 ] && { echo; exit 0; }

# Debian 12: Debian 13's headers under build/vulkan-headers/usr.
HDR=$PWD/build/vulkan-headers
if [ ! -f "$HDR/.done" ]; then
  apt_dir=$PWD/build/vulkan-apt
  rm -rf "$apt_dir" "$HDR"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$HDR"
  cat > "$apt_dir/trixie.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # Only this sources list and this lists directory: the system's apt state is neither read nor written, so
  # no lock on it is taken either (another apt may hold the system's).
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/trixie.sources" -o "Dir::Etc::SourceParts=-"
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir" -o "Dir::Cache::Archives=$apt_dir/archives"
            -o "Debug::NoLocking=1" -o "APT::Get::List-Cleanup=0")
  echo "Fetching Debian 13's libvulkan-dev and spirv-headers into $HDR" >&2
  apt-get "${apt_opts[@]}" update -q >&2
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" download libvulkan-dev spirv-headers >&2)
  for deb in "$apt_dir"/*.deb; do dpkg-deb -x "$deb" "$HDR"; done
  # libvulkan-dev's libvulkan.so points at trixie's libvulkan.so.1, which is not unpacked here: point it at
  # the system's loader (Debian 12's libvulkan1), the one the built library loads at run time.
  for so in "$HDR"/usr/lib/*/libvulkan.so; do
    ln -sf "/usr/lib/$(basename "$(dirname "$so")")/libvulkan.so.1" "$so"
  done
  touch "$HDR/.done"
fi
echo "$HDR/usr"
