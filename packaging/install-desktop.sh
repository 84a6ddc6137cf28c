#!/usr/bin/env bash
# `make install-desktop`: Aural's desktop entry, AppStream metadata and icons for the current user, in the
# XDG data folder ($XDG_DATA_HOME, default ~/.local/share):
#   applications/aural.desktop, metainfo/io.github.aural.Aural.metainfo.xml,
#   icons/hicolor/<N>x<N>/apps/aural.png (16 ... 256) and icons/hicolor/scalable/apps/aural.svg
# The entry runs `aural` from PATH. When the bundle dist/aural/ exists and $XDG_BIN_HOME (default
# ~/.local/bin) has no other `aural`, it links $XDG_BIN_HOME/aural to the bundle's executable.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${XDG_DATA_HOME:-$HOME/.local/share}
BIN=${XDG_BIN_HOME:-$HOME/.local/bin}

install -Dm644 resources/aural.desktop "$DATA/applications/aural.desktop"
install -Dm644 resources/io.github.aural.Aural.metainfo.xml "$DATA/metainfo/io.github.aural.Aural.metainfo.xml"
for png in resources/icons/aural-*.png; do
    size=${png##*-}
    size=${size%.png}
    install -Dm644 "$png" "$DATA/icons/hicolor/${size}x${size}/apps/aural.png"
done
install -Dm644 resources/aural.svg "$DATA/icons/hicolor/scalable/apps/aural.svg"
echo "installed aural.desktop, its AppStream metadata and icons under $DATA"

# Menus and icon themes pick new files up by themselves; refresh the caches where the tools exist.
if command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$DATA/applications" || true
fi
if command -v gtk-update-icon-cache >/dev/null && [[ -f $DATA/icons/hicolor/index.theme ]]; then
    gtk-update-icon-cache -q -t "$DATA/icons/hicolor" || true
fi

if [[ -x dist/aural/aural ]] && { [[ ! -e $BIN/aural ]] || [[ -L $BIN/aural ]]; }; then
    mkdir -p "$BIN"
    ln -sfn "$PWD/dist/aural/aural" "$BIN/aural"
    echo "linked $BIN/aural -> $PWD/dist/aural/aural"
fi
if ! PATH="$BIN:$PATH" command -v aural >/dev/null; then
    echo "note: no 'aural' on PATH; the menu entry runs 'aural' (make package, then make install-desktop)" >&2
elif [[ :$PATH: != *:$BIN:* ]] && [[ $(PATH="$BIN:$PATH" command -v aural) == "$BIN/aural" ]]; then
    echo "note: $BIN is not on PATH; add it so that the menu entry finds 'aural'" >&2
fi
