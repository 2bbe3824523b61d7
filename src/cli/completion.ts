/**
 * Shell completion scripts (bash, zsh, fish) generated from a program's commander definition (cmdtree.ts), printed
 * by `<program> completion <shell>` and shipped in the packages at the shells' standard paths (docs/cli.md).
 *
 * Why generated here and not by a library: commander 14 has none; the libraries that add it (tabtab, omelette,
 * @bomb.sh/tab) make the shell run the program again on every TAB (a Node.js start, ~0.2 s, and for gwsh a
 * profile read), and tabtab writes into the user's shell start-up files. A static script answers at once, can be
 * shipped as a file by the packages, and never runs the program, so a completion never prompts, dials or waits.
 *
 * Every script is the same small machine over the same tables:
 *   - walk the words typed so far: a word that names a subcommand of the current path extends the path (aliases
 *     too), an option that takes a value skips its value (also as --opt=value, which bash splits at "="), any other
 *     word is a positional argument of the current path (counted, for the argument's hint);
 *   - the word under the cursor is then: the value of the option just before it (its choices, a file, a directory,
 *     or nothing for a free word), an option (when it starts with "-": the path's options and its ancestors'), a
 *     subcommand, or the positional argument's hint.
 * A command line of more than MAX_WORDS words gets no completion (the walk costs a subshell per word: bounded).
 * The tables are shell `case` statements keyed by "path|word". Every word written into a script is a name from the
 * definition, quoted for the shell (sq), and descriptions are one line: a definition cannot break out of a quote.
 */
import { Argument, type Command } from 'commander';
import { allCommands, commandTree, type CommandSpec, type OptionSpec, type ValueHint } from './cmdtree.js';
import { manPage, type ManPageInfo } from './manpage.js';

export const SHELLS = ['bash', 'zsh', 'fish'] as const;
/** Past this many words on the command line, the scripts offer nothing rather than walk them all. */
export const MAX_WORDS = 256;
export type Shell = (typeof SHELLS)[number];

/** Single-quoted for sh, bash, zsh and fish (fish also reads \' inside single quotes, so the close-reopen form is used). */
function sq(s: string): string {
  return `'${s.replace(/'/g, `'"'"'`)}'`;
}

/** A description on one line, bounded (the shells show it beside the candidate). */
function oneLine(s: string, max = 100): string {
  const t = s.replace(/\s+/g, ' ').trim();
  return t.length > max ? `${t.slice(0, max - 1)}…` : t;
}

function key(cmd: CommandSpec, word: string): string {
  return sq(`${cmd.path.slice(1).join(' ')}|${word}`);
}

function hintWord(h: ValueHint | undefined): string {
  if (!h || h.kind === 'word') return 'word';
  if (h.kind === 'choices') return `choices ${h.values.join(' ')}`;
  return h.kind;
}

interface Tables {
  /** path|word -> canonical subcommand name */
  sub: Array<[string, string]>;
  /** path -> subcommands (name, description) */
  subs: Array<[string, Array<[string, string]>]>;
  /** path -> options (flag, description) */
  opts: Array<[string, Array<[string, string]>]>;
  /** path|flag -> value hint ("word" when it takes a free value) */
  values: Array<[string, string]>;
  /** path|index -> the positional argument's hint; path|* for a variadic last one */
  args: Array<[string, string]>;
}

function optionFlags(o: OptionSpec): Array<[string, string]> {
  return o.flags.map((f) => [f, oneLine(o.description)]);
}

function tables(root: CommandSpec): Tables {
  const t: Tables = { sub: [], subs: [], opts: [], values: [], args: [] };
  for (const c of allCommands(root)) {
    const path = sq(c.path.slice(1).join(' '));
    for (const s of c.commands) for (const n of [s.name, ...s.aliases]) t.sub.push([key(c, n), s.name]);
    if (c.commands.length > 0) t.subs.push([path, c.commands.map((s) => [s.name, oneLine(s.description)])]);
    t.opts.push([path, c.allOptions.flatMap(optionFlags)]);
    for (const o of c.allOptions) if (o.value !== undefined) for (const f of o.flags) t.values.push([key(c, f), hintWord(o.hint)]);
    c.args.forEach((a, i) => {
      t.args.push([key(c, a.variadic ? '*' : String(i)), hintWord(a.hint)]);
    });
  }
  return t;
}

/** The helper functions shared by bash and zsh (both read this `case` syntax). */
function shCaseFunctions(fn: string, t: Tables): string {
  const lines: string[] = [];
  const caseFn = (name: string, subject: string, rows: Array<[string, string]>, fallback: string): void => {
    lines.push(`${name}() {`, `  case ${subject} in`);
    for (const [k, v] of rows) lines.push(`    ${k}) printf '%s\\n' ${sq(v)} ;;`);
    lines.push(`    *) ${fallback} ;;`, '  esac', '}');
  };
  caseFn(`${fn}_sub`, '"$1|$2"', t.sub, 'return 1');
  caseFn(`${fn}_subs`, '"$1"', t.subs.map(([k, v]) => [k, v.map(([n, d]) => `${n}:${d}`).join('\n')]), 'return 0');
  caseFn(`${fn}_opts`, '"$1"', t.opts.map(([k, v]) => [k, v.map(([n, d]) => `${n}:${d}`).join('\n')]), 'return 0');
  caseFn(`${fn}_value`, '"$1|$2"', t.values, 'return 1');
  caseFn(`${fn}_arg`, '"$1|$2"', t.args, 'return 1');
  // The walk: sets path, nargs (positional words at path) and flag (the option whose value is under the cursor).
  lines.push(
    `${fn}_walk() {`,
    '  # $1: index of the word under the cursor; the words are in the array named by $2 (0: the program).',
    '  local i w n skip=0 s',
    '  path="" nargs=0 flag=""',
    `  if [ "$1" -gt ${MAX_WORDS} ]; then return 1; fi`,
    '  for ((i = 1; i < $1; i++)); do',
    `    eval "w=\\\${$2[i]}"`,
    '    if ((skip > 0)); then skip=$((skip - 1)); continue; fi',
    '    case "$w" in',
    '      --) ;;',
    '      -*=*) ;;',
    `      -*) if ${fn}_value "$path" "$w" >/dev/null; then eval "n=\\\${$2[i+1]}"; if [ "$n" = "=" ]; then skip=2; else skip=1; fi; fi ;;`,
    `      *) if s=$(${fn}_sub "$path" "$w"); then path="\${path:+$path }$s"; nargs=0; else nargs=$((nargs + 1)); fi ;;`,
    '    esac',
    '  done',
    '  local prev prev2',
    '  eval "prev=\\${$2[$1 - 1]}"',
    '  if [ "$prev" = "=" ] && [ "$1" -ge 2 ]; then eval "prev2=\\${$2[$1 - 2]}"; prev="$prev2"; fi',
    `  if [ "$1" -ge 2 ] && ${fn}_value "$path" "$prev" >/dev/null; then flag="$prev"; fi`,
    '}',
  );
  return lines.join('\n');
}

function fnName(program: string): string {
  return `__${program.replace(/[^A-Za-z0-9]/g, '_')}`;
}

function bashScript(root: CommandSpec): string {
  const fn = fnName(root.name);
  return [
    `# bash completion for ${root.name}, generated from its command definitions by \`${root.name} completion bash\`.`,
    `# Install: ${root.name} completion bash > ~/.local/share/bash-completion/completions/${root.name}`,
    shCaseFunctions(fn, tables(root)),
    `${fn}_reply() {`,
    '  local cur="$2"',
    '  case "$1" in',
    '    choices\\ *) COMPREPLY=($(compgen -W "${1#choices }" -- "$cur")) ;;',
    '    file) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")) ;;',
    '    dir) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur")) ;;',
    '    *) COMPREPLY=() ;;',
    '  esac',
    '}',
    `${fn}_complete() {`,
    '  local cur="${COMP_WORDS[COMP_CWORD]}" path nargs flag h',
    '  [ "$cur" = "=" ] && cur=""',
    `  COMPREPLY=(); ${fn}_walk "$COMP_CWORD" COMP_WORDS || return 0`,
    `  if [ -n "$flag" ]; then ${fn}_reply "$(${fn}_value "$path" "$flag")" "$cur"; return 0; fi`,
    `  if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "$(${fn}_opts "$path" | cut -d: -f1)" -- "$cur")); return 0; fi`,
    `  h=$(${fn}_subs "$path" | cut -d: -f1)`,
    '  if [ -n "$h" ]; then COMPREPLY=($(compgen -W "$h" -- "$cur")); return 0; fi',
    `  h=$(${fn}_arg "$path" "$nargs") || h=$(${fn}_arg "$path" '*') || h=word`,
    `  ${fn}_reply "$h" "$cur"`,
    '}',
    `complete -F ${fn}_complete ${root.name}`,
    '',
  ].join('\n');
}

function zshScript(root: CommandSpec): string {
  const fn = fnName(root.name);
  return [
    `#compdef ${root.name}`,
    `# zsh completion for ${root.name}, generated from its command definitions by \`${root.name} completion zsh\`.`,
    `# Install: ${root.name} completion zsh > "\${fpath[1]}/_${root.name}" (then compinit), or source it after compinit.`,
    shCaseFunctions(fn, tables(root)),
    `${fn}_reply() {`,
    '  case "$1" in',
    "    choices\\ *) local -a c; c=(${=${1#choices }}); compadd -a c ;;",
    '    file) _files ;;',
    '    dir) _files -/ ;;',
    '    *) return 1 ;;',
    '  esac',
    '}',
    `_${root.name.replace(/[^A-Za-z0-9]/g, '_')}() {`,
    '  emulate -L zsh; setopt ksh_arrays',
    '  local -a cwords; cwords=("${words[@]}")',
    '  local path nargs flag h',
    '  local -a lines',
    `  ${fn}_walk "$((CURRENT - 1))" cwords || return 1`,
    '  local cur="${cwords[CURRENT - 1]}"',
    '  unsetopt ksh_arrays',
    `  if [[ "$cur" == -*=* ]] && h=$(${fn}_value "$path" "\${cur%%=*}"); then compset -P '*='; ${fn}_reply "$h"; return; fi`,
    `  if [[ -n "$flag" ]]; then ${fn}_reply "$(${fn}_value "$path" "$flag")"; return; fi`,
    `  if [[ "$cur" == -* ]]; then lines=("\${(@f)$(${fn}_opts "$path")}"); _describe -t options option lines; return; fi`,
    `  lines=("\${(@f)$(${fn}_subs "$path")}")`,
    '  if [[ -n "${lines[1]}" ]]; then _describe -t commands command lines; return; fi',
    `  h=$(${fn}_arg "$path" "$nargs") || h=$(${fn}_arg "$path" '*') || h=word`,
    `  ${fn}_reply "$h"`,
    '}',
    // Loaded from fpath (autoload): run for this completion; sourced: register with compdef.
    `if [[ "\${zsh_eval_context[-1]}" == loadautofunc ]]; then _${root.name.replace(/[^A-Za-z0-9]/g, '_')} "$@"; else compdef _${root.name.replace(/[^A-Za-z0-9]/g, '_')} ${root.name}; fi`,
    '',
  ].join('\n');
}

function fishCase(name: string, rows: Array<[string, string]>, fallback: string): string {
  const lines = [`function ${name}`, '    switch "$argv[1]|$argv[2]"'];
  for (const [k, v] of rows) lines.push(`        case ${k.replace(/\*/g, '\\*')}`, ...v.split('\n').map((l) => `            printf '%s\\n' ${sq(l)}`));
  lines.push('        case \'*\'', `            ${fallback}`, '    end', 'end');
  return lines.join('\n');
}

function fishScript(root: CommandSpec): string {
  const fn = fnName(root.name);
  const t = tables(root);
  const pathRows = (rows: Array<[string, Array<[string, string]>]>): Array<[string, string]> =>
    rows.map(([k, v]) => [`${k.slice(0, -1)}|'`, v.map(([n, d]) => `${n}\t${d}`).join('\n')]);
  return [
    `# fish completion for ${root.name}, generated from its command definitions by \`${root.name} completion fish\`.`,
    `# Install: ${root.name} completion fish > ~/.config/fish/completions/${root.name}.fish`,
    fishCase(`${fn}_sub`, t.sub, 'return 1'),
    fishCase(`${fn}_subs`, pathRows(t.subs), 'return 0'),
    fishCase(`${fn}_opts`, pathRows(t.opts), 'return 0'),
    fishCase(`${fn}_value`, t.values, 'return 1'),
    fishCase(`${fn}_arg`, t.args, 'return 1'),
    `function ${fn}_reply`,
    '    # $argv[1]: the hint; $argv[2]: the word typed so far',
    '    set -l h (string split " " -- $argv[1])',
    '    switch $h[1]',
    '        case choices',
    '            printf "%s\\n" $h[2..-1]',
    '        case file',
    '            __fish_complete_path $argv[2]',
    '        case dir',
    '            __fish_complete_directories $argv[2]',
    '    end',
    'end',
    `function ${fn}_complete`,
    '    set -l words (commandline -opc)',
    '    set -l cur (commandline -ct)',
    '    set -l path ""',
    '    set -l nargs 0',
    '    set -l skip 0',
    `    if test (count $words) -gt ${MAX_WORDS}; return; end`,
    '    for w in $words[2..-1]',
    '        if test $skip -gt 0; set skip (math $skip - 1); continue; end',
    '        switch $w',
    "            case '--' '-*=*'",
    "            case '-*'",
    `                if ${fn}_value "$path" "$w" >/dev/null; set skip 1; end`,
    "            case '*'",
    `                if set -l s (${fn}_sub "$path" "$w")`,
    '                    if test -n "$path"; set path "$path $s"; else; set path $s; end',
    '                    set nargs 0',
    '                else',
    '                    set nargs (math $nargs + 1)',
    '                end',
    '        end',
    '    end',
    '    set -l prev $words[-1]',
    `    if test (count $words) -ge 2; and test $skip -gt 0; and set -l h (${fn}_value "$path" "$prev")`,
    `        ${fn}_reply "$h" $cur; return`,
    '    end',
    "    if string match -q -- '-*=*' $cur",
    '        set -l parts (string split -m1 = -- $cur)',
    `        if set -l h (${fn}_value "$path" $parts[1])`,
    `            for c in (${fn}_reply "$h" $parts[2])`,
    "                printf '%s=%s\\n' $parts[1] $c",
    '            end',
    '        end',
    '        return',
    '    end',
    "    if string match -q -- '-*' $cur",
    `        ${fn}_opts "$path" ''; return`,
    '    end',
    `    set -l subs (${fn}_subs "$path" '')`,
    '    if test -n "$subs"; printf "%s\\n" $subs; return; end',
    `    set -l h (${fn}_arg "$path" $nargs); or set h (${fn}_arg "$path" '*'); or set h word`,
    `    ${fn}_reply "$h" $cur`,
    'end',
    `complete -c ${root.name} -f -a '(${fn}_complete)'`,
    '',
  ].join('\n');
}

/** The completion script of a program for a shell. */
export function completionScript(program: Command, shell: Shell): string {
  const root = commandTree(program);
  if (shell === 'bash') return bashScript(root);
  if (shell === 'zsh') return zshScript(root);
  return fishScript(root);
}

/**
 * Adds `completion <shell>` (prints the script, as kubectl and gh do) and the hidden `man` (prints the manual
 * page in roff; the packages install its output) to a program. Call after every other command is defined.
 */
export function addCompletionCommands(program: Command, page: ManPageInfo): void {
  program
    .command('completion')
    .description(`print the shell completion script for ${SHELLS.join(', ')} (docs/cli.md: where to put it)`)
    .addArgument(new Argument('<shell>', `the shell: ${SHELLS.join(', ')}`).choices(SHELLS))
    .action((shell: Shell) => {
      process.stdout.write(completionScript(program, shell));
    });
  program
    .command('man', { hidden: true })
    .description('print the manual page (roff)')
    .action(() => {
      process.stdout.write(manPage(program, page));
    });
}
