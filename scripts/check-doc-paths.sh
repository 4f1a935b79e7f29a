#!/usr/bin/env bash
# Fails when a doc example names `tollgate_core::`, `tollgate_tower::` or
# `tollgate_axum::`. An app depends on `tollgate` alone, so an example pasted
# from the docs must import through the facade (`tollgate::...`).
#
# Usage: scripts/check-doc-paths.sh [--skip GLOB]... PATH...
#   Each PATH is a file or a directory (searched recursively) of:
#   - rustdoc HTML pages (`*.html`; run `cargo doc` first), e.g.
#     target/doc/tollgate/tower, or target/doc/tollgate_core for one crate.
#     Checked: every `<pre class="rust ...">` block, i.e. the examples and
#     the item declarations as rendered.
#   - Rust sources (`*.rs`): the fenced code blocks of `///` and `//!`
#     comments, hidden `# ` lines included. rustdoc leaves hidden lines out
#     of the HTML, so only the sources show them.
#   `--skip GLOB` leaves out the files whose path matches GLOB (a shell
#   pattern; `*` also matches `/`).
# Prose is not checked: an intra-doc link may target `tollgate_core::...`.
set -euo pipefail

usage() {
    echo "usage: $0 [--skip GLOB]... PATH..." >&2
    exit 2
}

skips=()
paths=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --skip)
            [ "$#" -ge 2 ] || usage
            skips+=("$2")
            shift 2
            ;;
        -*) usage ;;
        *)
            paths+=("$1")
            shift
            ;;
    esac
done
[ "${#paths[@]}" -gt 0 ] || usage

skipped() {
    local glob
    for glob in "${skips[@]+"${skips[@]}"}"; do
        # shellcheck disable=SC2053 # the glob is meant to match as a pattern
        [[ "$1" == $glob ]] && return 0
    done
    return 1
}

files=()
for path in "${paths[@]}"; do
    if [ -d "$path" ]; then
        while IFS= read -r -d '' file; do
            skipped "$file" || files+=("$file")
        done < <(find "$path" -type f \( -name '*.html' -o -name '*.rs' \) -print0 | sort -z)
    elif [ -f "$path" ]; then
        skipped "$path" || files+=("$path")
    else
        # A missing page must not pass as a clean one (no `cargo doc`, a typo, a renamed module).
        echo "check-doc-paths: no such file or directory: $path" >&2
        exit 2
    fi
done
if [ "${#files[@]}" -eq 0 ]; then
    echo "check-doc-paths: nothing to check under ${paths[*]}" >&2
    exit 2
fi

perl -0777 -ne '
    BEGIN { $files = 0; $blocks = 0; $bad = 0 }
    sub check {
        my ($where, $line) = @_;
        if ($line =~ /\btollgate_(?:core|tower|axum)::/) {
            print "$where: $line\n";
            $bad++;
        }
    }
    $files++;
    if ($ARGV =~ /\.rs$/) {
        my ($n, $fenced) = (0, 0);
        for my $line (split /\n/) {
            $n++;
            if ($line !~ m{^\s*//[/!]}) { $fenced = 0; next }
            if ($line =~ m{^\s*//[/!]\s*```}) { $fenced = !$fenced; $blocks++ if $fenced; next }
            check("$ARGV:$n", $line) if $fenced;
        }
    } else {
        while (m{<pre class="rust[^"]*">(.*?)</pre>}gs) {
            $blocks++;
            my $code = $1;
            $code =~ s/<[^>]*>//g;
            $code =~ s/&lt;/</g; $code =~ s/&gt;/>/g; $code =~ s/&quot;/"/g;
            $code =~ s/&#39;/\x27/g; $code =~ s/&amp;/&/g;
            check($ARGV, $_) for split /\n/, $code;
        }
    }
    END {
        printf STDERR "check-doc-paths: %d code blocks in %d files, %d line(s) naming tollgate_core/tower/axum\n",
            $blocks, $files, $bad;
        exit($bad ? 1 : 0);
    }
' "${files[@]}"
