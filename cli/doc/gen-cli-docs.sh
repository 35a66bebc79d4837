#!/bin/sh
# gen-cli-docs.sh KWARM KWARMD OUTDIR: writes OUTDIR/kwarm.bash (bash
# completion), OUTDIR/kwarm.1 and OUTDIR/kwarmd.8 (man pages) from the
# --help texts of the binaries just built.  Run by the build: each --help
# is printed from the same option table getopt_long parses with (kwarmd:
# daemon/main.c; kwarm: each command's kw__cli_cmd, cli/cli_opt.c), so
# completion and man pages cannot drift from the options the commands
# take (tests/test_cli_help.c probes the parsers against the files).
set -eu
kwarm=$1 kwarmd=$2 out=$3
mkdir -p "$out"

# The commands, as `kwarm --help` lists them under "Commands:".
commands=$("$kwarm" --help | sed -n '/^Commands:$/,/^$/p' | awk 'NR > 1 && NF { print $1 }')
version=$("$kwarm" --version | sed -n '1s/^kwarm //p')

# The flags a help text offers: those of its usage block (from "usage:" to
# the first empty line) and of its option lines ("  --flag ARG   what it
# does"; the description is left out, since it may name other commands'
# flags).
flags() {
    awk '/^usage:/ { u = 1 } u && /^$/ { u = 0 }
         u { print; next }
         /^  -/ { sub(/^ +/, ""); sub(/   .*/, ""); print }' |
        grep -oE '(^|[][ (|,])--?[a-z][a-z0-9-]*' | sed 's/^[][ (|,]*//' |
        grep -vE '^-[a-z][a-z0-9]' | grep -vE -- '-$' | sort -u | tr '\n' ' '
}

# ---- bash completion ------------------------------------------------------
{
    echo "# bash completion for kwarm $version, generated from its --help"
    echo "# texts by cli/doc/gen-cli-docs.sh at build time: do not edit."
    echo "_kwarm() {"
    echo '    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}'
    echo '    local cmd=${COMP_WORDS[1]} words'
    echo '    if [ "$COMP_CWORD" -eq 1 ]; then'
    echo "        COMPREPLY=(\$(compgen -W \"$(echo $commands) help --help --version\" -- \"\$cur\"))"
    echo '        return'
    echo '    fi'
    echo '    case $prev in'
    echo '        --model|--deploy|--cache|--socket|--remote-key-file|-o|--output|--compile-helper|--against)'
    echo '            COMPREPLY=($(compgen -f -- "$cur")); return ;;'
    echo '    esac'
    echo '    case $cmd in'
    for c in $commands; do
        echo "        $c) words=\"$("$kwarm" "$c" --help | flags)\" ;;"
    done
    echo "        help) words=\"$(echo $commands)\" ;;"
    echo '        *) words= ;;'
    echo '    esac'
    echo '    COMPREPLY=($(compgen -W "$words" -- "$cur"))'
    echo "}"
    echo "complete -F _kwarm kwarm"
} >"$out/kwarm.bash.tmp"
mv "$out/kwarm.bash.tmp" "$out/kwarm.bash"

# ---- man pages -----------------------------------------------------------
# Help text as a roff literal block: backslashes escaped, a leading '.' or
# "'" guarded.
roff() {
    echo ".nf"
    sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
    echo ".fi"
}

{
    echo ".TH KWARM 1 \"\" \"kwarm $version\" \"User Commands\""
    echo ".SH NAME"
    printf '%s\n' 'kwarm \- derive, compile and cache the JIT kernels of sparse-MLA models'
    echo ".SH SYNOPSIS"
    echo ".B kwarm"
    echo ".I COMMAND"
    printf '%s\n' '[\fIARGS\fR]'
    echo ".SH DESCRIPTION"
    "$kwarm" --help | roff
    echo ".SH COMMANDS"
    for c in $commands; do
        echo ".SS kwarm $c"
        "$kwarm" "$c" --help | roff
    done
    echo ".SH EXIT STATUS"
    echo "0: ok; 1: a runtime failure (a key failed, kwarmd unreachable, ...);"
    echo "2: bad input (a flag, file, path, pin name, arch or key field)."
    echo ".SH SEE ALSO"
    echo ".BR kwarmd (8)"
} >"$out/kwarm.1.tmp"
mv "$out/kwarm.1.tmp" "$out/kwarm.1"

{
    echo ".TH KWARMD 8 \"\" \"kwarm $version\" \"System Administration\""
    echo ".SH NAME"
    printf '%s\n' 'kwarmd \- the kwarm compile-cache daemon'
    echo ".SH SYNOPSIS"
    echo ".B kwarmd"
    printf '%s\n' '[\fIOPTIONS\fR]'
    echo ".SH DESCRIPTION"
    "$kwarmd" --help | roff
    echo ".SH SEE ALSO"
    echo ".BR kwarm (1)"
} >"$out/kwarmd.8.tmp"
mv "$out/kwarmd.8.tmp" "$out/kwarmd.8"
