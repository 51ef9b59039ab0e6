#!/usr/bin/env bash
# Installs the Debian packages qattn needs, only those that are missing.
# Used by tools/quickstart.sh and tools/test.sh; safe to run again.
set -euo pipefail
# Libraries and build tools: by Debian package name.
pkgs=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libspdlog-dev libcli11-dev catch2
      libpcre2-dev python3-matplotlib)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Programs that may come from elsewhere (nodesource, pyenv): by command.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v python3 >/dev/null || missing+=(python3)
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
    { $sudo_cmd apt-get update >/dev/null && $sudo_cmd apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi
