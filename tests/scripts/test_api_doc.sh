#!/usr/bin/env bash
# docs/API.md stays honest: every public header (include/msa/*.hpp) is named in
# it, and every function, struct, class, enum, type alias, constant and macro
# declared in a header is mentioned there in code format (`name` or inside a
# `...` span), outside the headers' `namespace detail` blocks.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
doc="$root/docs/API.md"
[[ -f $doc ]] || { echo "FAIL: $doc is missing"; exit 1; }
# The text of API.md's code spans (which may wrap lines), one per line.
spans=$(tr '\n' ' ' <"$doc" | grep -oP '`[^`]+`')
missing=()
count=0
for header in "$root"/include/msa/*.hpp; do
  name="msa/$(basename "$header")"
  grep -qF "$name" "$doc" || missing+=("header $name")
  # Declarations, with comments and namespace detail blocks removed.
  decls=$(awk '
    /^namespace detail \{/ { skip = 1; next }
    skip && /^\}  \/\/ namespace detail/ { skip = 0; next }
    skip { next }
    { sub(/\/\/.*/, ""); print }' "$header")
  names=$(
    {
      # struct / class / enum names
      grep -oP '^\s*(struct|class|enum class|enum)\s+\K\w+' <<<"$decls"
      # type aliases and constants
      grep -oP '^\s*using\s+\K\w+(?=\s*=)' <<<"$decls"
      grep -oP '^\s*inline\s+constexpr\s+[\w:]+\s+\K\w+' <<<"$decls"
      # macros
      grep -oP '^#define\s+\K\w+' <<<"$decls"
      # functions: [qualifiers] type name(, where type is not a statement keyword
      grep -oP '^\s*(?:(?:static|inline|constexpr|MSA_HD|explicit|friend|\[\[nodiscard\]\]|\[\[noreturn\]\])\s+)*(?!(?:return|throw|else|case|new|delete|using|typedef|namespace|struct|class|enum|template|if|for|while|switch|do)\b)(?:const\s+)?[A-Za-z_][\w:]*(?:<[^;()]*>)?\s*[*&]*\s+[*&]*\K\w+(?=\s*\()' <<<"$decls"
    } | sort -u)
  for n in $names; do
    count=$((count + 1))
    grep -qP "\b$n\b" <<<"$spans" || missing+=("$n ($name)")
  done
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "FAIL: docs/API.md does not mention (in code format):"
  printf '  %s\n' "${missing[@]}"
  exit 1
fi
echo "api doc: $count public names of $(ls "$root"/include/msa/*.hpp | wc -l) headers are documented"
