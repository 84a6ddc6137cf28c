#!/usr/bin/env bash
# System packages Aural needs on Debian 12/13: a C++ toolchain for the native module, Qt's runtime
# libraries and Xvfb for the GUI, PortAudio + PulseAudio for capture (and the tests' virtual
# microphone), espeak-ng + sox for generated speech. Installs what is missing when run as root;
# otherwise prints the apt-get line and fails.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config python3-dev python3-venv
  libgl1 libegl1 libx11-6 libdbus-1-3 libfontconfig1 libfreetype6 libglib2.0-0 libxkbcommon0 fonts-dejavu-core
  libx11-xcb1 libxcb1 libxcb-cursor0 libxcb-glx0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1
  libxcb-randr0 libxcb-render-util0 libxcb-render0 libxcb-shape0 libxcb-shm0 libxcb-sync1
  libxcb-util1 libxcb-xfixes0 libxcb-xkb1 libxkbcommon-x11-0
  xvfb xauth x11-utils imagemagick
  libportaudio2 pulseaudio pulseaudio-utils libasound2-plugins
  espeak-ng sox libsox-fmt-mp3 libopenblas-dev desktop-file-utils appstream
)

# Debian 13 (trixie) renamed the libraries of the 64-bit time_t transition with a t64 suffix; the old
# names are only virtual there, which dpkg-query never reports as installed.
. /etc/os-release
if [ "${VERSION_ID%%.*}" -ge 13 ] 2>/dev/null; then
  PACKAGES=("${PACKAGES[@]/#libglib2.0-0/libglib2.0-0t64}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "Aural needs these Debian packages; install them with:" >&2
  echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "Installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
