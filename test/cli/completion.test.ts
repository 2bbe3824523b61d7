/**
 * Shell completion and manual pages generated from the commands' definitions (src/cli/cmdtree.ts, completion.ts,
 * manpage.ts), from the built CLIs: real bash runs each program's script (complete -p, then the completion function
 * with COMP_WORDS / COMP_CWORD set as bash sets them, and COMPREPLY read back); real fish runs `complete -C` with
 * its script loaded; zsh checks its script with `zsh -n` and runs the completion function with zsh's completion
 * builtins (compadd, _describe, _files) replaced by stubs that print what they are given (a completion widget
 * needs an interactive terminal: what is not real here is only the last step, the display). The manual pages pass
 * groff -man -ww (every warning). Hostile: words typed on the command line are never run by a script, and a
 * definition's text (a description with quotes, $( ), a leading ".") cannot break out of its quoting in a script
 * or become a request in a page.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, existsSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command, Option } from 'commander';
import { afterAll, describe, expect, it } from 'vitest';
import { completeValues } from '../../src/cli/cmdtree.js';
import { completionScript, MAX_WORDS } from '../../src/cli/completion.js';
import { manPage, roffText } from '../../src/cli/manpage.js';

const PROGRAMS = ['gateway', 'gwctl', 'gwsh', 'gateway-upgrade', 'gateway-kube-updater'] as const;
type Program = (typeof PROGRAMS)[number];
const bin = (p: Program) => fileURLToPath(new URL(`../../dist/cli/${p}.js`, import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'gw-completion-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function sh(cmd: string, args: string[], input?: string): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 20_000, env: { PATH: process.env.PATH ?? '', HOME: dir }, ...(input === undefined ? {} : { input }) });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

const scripts = new Map<string, string>();
/** The script a program prints for a shell, written to a file (once). */
function script(p: Program, shell: 'bash' | 'zsh' | 'fish'): string {
  const file = join(dir, `${p}.${shell}`);
  if (!scripts.has(file)) {
    const r = sh(process.execPath, [bin(p), 'completion', shell]);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    writeFileSync(file, r.stdout);
    scripts.set(file, r.stdout);
  }
  return file;
}

/** bash: COMPREPLY for the words typed (the last one is under the cursor), as bash's programmable completion runs it. */
function bashComplete(p: Program, words: string[], file = script(p, 'bash')): string[] {
  const prog = [
    'source "$1"; shift',
    'COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))',
    // the function complete -p names, called as bash calls it: command, current word, previous word
    'f=$(complete -p "$1" | sed -E "s/.* -F ([^ ]+) .*/\\1/")',
    '"$f" "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"',
    'printf "%s\\n" "${COMPREPLY[@]}"',
  ].join('\n');
  const r = sh('bash', ['--norc', '--noprofile', '-c', prog, 'bash', file, ...words]);
  expect(r.stderr).toBe('');
  return r.stdout.split('\n').filter(Boolean);
}

function fishComplete(p: Program, line: string): string[] {
  const r = sh('fish', ['--no-config', '-c', 'source $argv[1]; complete -C $argv[2]', script(p, 'fish'), line]);
  expect(r.stderr).toBe('');
  return r.stdout.split('\n').filter(Boolean).map((l) => l.split('\t')[0]!);
}

const ZSH_STUBS = [
  'compadd() { if [[ $1 == -a ]]; then print -l -- "${(@P)2}"; else print -l -- "$@"; fi }',
  '_describe() { print -l -- "${(@P)4%%:*}"; }',
  '_files() { print -- "<files $*>"; }',
  'compset() { :; }',
  'compdef() { :; }',
  'source $1',
  'words=("${(@)argv[3,-1]}")',
  'CURRENT=${#words}',
  '$2',
].join('\n');

function zshComplete(p: Program, words: string[]): string[] {
  const r = sh('zsh', ['-f', '-c', ZSH_STUBS, 'zsh', script(p, 'zsh'), `_${p.replace(/-/g, '_')}`, ...words]);
  expect(r.stderr).toBe('');
  return r.stdout.split('\n').filter(Boolean).map((l) => l.replace(/:.*$/, ''));
}

/** The commands `<program> --help` lists (commander's own help: what completion must offer). */
function helpCommands(p: Program, ...path: string[]): string[] {
  const out = sh(process.execPath, [bin(p), ...path, '--help']).stdout;
  const section = out.split(/^Commands:$/m)[1] ?? '';
  return [...section.matchAll(/^ {2}([a-z][\w-]*)(?:\|\w+)?/gm)].map((m) => m[1]!).filter((c) => c !== 'help');
}

describe('bash', () => {
  it('registers a function for each program (complete -p), and offers exactly the commands --help lists', () => {
    for (const p of PROGRAMS) {
      const r = sh('bash', ['--norc', '-c', 'source "$1"; complete -p "$2"', 'bash', script(p, 'bash'), p]);
      expect(r.stdout.trim()).toMatch(new RegExp(`^complete -F \\S+ ${p}$`));
      const offered = bashComplete(p, [p, '']);
      expect(offered.sort(), p).toEqual(helpCommands(p).sort());
    }
    expect(bashComplete('gwctl', ['gwctl', 'users', '']).sort()).toEqual(helpCommands('gwctl', 'users').sort());
  });

  it('completes subcommands, options (the path\'s and the program\'s), and option values: -f text|json|yaml', () => {
    expect(bashComplete('gwctl', ['gwctl', 'us'])).toEqual(['users']);
    expect(bashComplete('gwctl', ['gwctl', 'status', '-f', ''])).toEqual(['text', 'json', 'yaml']);
    expect(bashComplete('gwctl', ['gwctl', 'status', '--format', 'y'])).toEqual(['yaml']);
    // bash splits --format=j at "=" (COMP_WORDBREAKS): the words are --format, =, j
    expect(bashComplete('gwctl', ['gwctl', 'status', '--format', '=', 'j'])).toEqual(['json']);
    expect(bashComplete('gwctl', ['gwctl', 'status', '--format', '='])).toEqual(['text', 'json', 'yaml']);
    const opts = bashComplete('gwctl', ['gwctl', 'status', '--']);
    expect(opts).toEqual(expect.arrayContaining(['--format', '--auth-server', '--data-dir', '--config']));
    // An option's value is not taken for a subcommand: "status" after --data-dir is the directory.
    expect(bashComplete('gwctl', ['gwctl', '--data-dir', 'status', ''])).toEqual(bashComplete('gwctl', ['gwctl', '']));
    expect(bashComplete('gwctl', ['gwctl', '-d', '/tmp', 'users', ''])).toEqual(bashComplete('gwctl', ['gwctl', 'users', '']));
    expect(bashComplete('gateway', ['gateway', 'completion', ''])).toEqual(['bash', 'zsh', 'fish']);
    expect(bashComplete('gateway-upgrade', ['gateway-upgrade', 'repo', '']).sort()).toEqual(['set-channel', 'set-source', 'show']);
    expect(bashComplete('gateway-kube-updater', ['gateway-kube-updater', '--agent-kind', ''])).toEqual(['statefulset', 'deployment']);
  });

  it('completes files for <file> values and directories for <dir>, and nothing for a free word', () => {
    mkdirSync(join(dir, 'confdir'), { recursive: true });
    writeFileSync(join(dir, 'conf.yaml'), '');
    expect(bashComplete('gateway', ['gateway', 'start', '-c', join(dir, 'conf')]).sort()).toEqual([join(dir, 'conf.yaml'), join(dir, 'confdir')]);
    expect(bashComplete('gateway', ['gateway', 'start', '--data-dir', join(dir, 'conf')])).toEqual([join(dir, 'confdir')]);
    expect(bashComplete('gateway', ['gateway', 'start', '--token', ''])).toEqual([]);
  });

  it('never runs what is typed: $( ), backquotes and quotes in the words are only words', () => {
    const marker = join(dir, 'ran');
    for (const evil of [`$(touch ${marker})`, `\`touch ${marker}\``, `'; touch ${marker}; '`, `x"; touch ${marker}; "`]) {
      bashComplete('gwctl', ['gwctl', evil, '-d', evil, '']);
      bashComplete('gwctl', ['gwctl', evil, '--format', '=', evil]);
      zshComplete('gwctl', ['gwctl', evil, '-d', evil, '']);
      fishComplete('gwctl', `gwctl ${evil.replace(/'/g, "\\'")} `);
    }
    expect(existsSync(marker)).toBe(false);
  });
});

describe('zsh', () => {
  it('every script parses (zsh -n) and starts with #compdef for its program', () => {
    for (const p of PROGRAMS) {
      const r = sh('zsh', ['-n', script(p, 'zsh')]);
      expect(r.stderr, p).toBe('');
      expect(r.status).toBe(0);
      expect(scripts.get(script(p, 'zsh'))!.split('\n')[0]).toBe(`#compdef ${p}`);
    }
  });

  it('its completion function offers the commands, options and values', () => {
    expect(zshComplete('gwctl', ['gwctl', '']).sort()).toEqual(helpCommands('gwctl').sort());
    expect(zshComplete('gwctl', ['gwctl', 'status', '-f', ''])).toEqual(['text', 'json', 'yaml']);
    expect(zshComplete('gwctl', ['gwctl', 'status', '--format=j'])).toEqual(['text', 'json', 'yaml']);
    expect(zshComplete('gwsh', ['gwsh', 'login', '-'])).toEqual(expect.arrayContaining(['--proxy', '--user']));
    expect(zshComplete('gateway', ['gateway', 'start', '-c', ''])).toEqual(['<files >']);
  });
});

describe('fish', () => {
  it('every script parses (fish -n) and completes with fish\'s own complete -C', () => {
    for (const p of PROGRAMS) {
      const r = sh('fish', ['--no-config', '-n', script(p, 'fish')]);
      expect(r.stderr, p).toBe('');
      expect(r.status).toBe(0);
    }
    expect(fishComplete('gwctl', 'gwctl ').sort()).toEqual(helpCommands('gwctl').sort());
    expect(fishComplete('gwctl', 'gwctl status -f ').sort()).toEqual(['json', 'text', 'yaml']);
    expect(fishComplete('gwctl', 'gwctl status --format=j')).toEqual(['--format=json']);
    expect(fishComplete('gateway-upgrade', 'gateway-upgrade repo ').sort()).toEqual(['set-channel', 'set-source', 'show']);
    writeFileSync(join(dir, 'fishconf.yaml'), '');
    expect(fishComplete('gateway', `gateway start -c ${join(dir, 'fishconf')}`)).toEqual([join(dir, 'fishconf.yaml')]);
  });
});

describe('a definition that holds shell and roff syntax', () => {
  const marker = join(dir, 'defined');
  const program = new Command('evil').description(`.SH INJECTED\n'quoted' "double" $(touch ${marker}) \`touch ${marker}\` back\\slash`);
  program.command('sub').description(`it's $(touch ${marker})`).addOption(completeValues(new Option('--mode <mode>', "a 'mode'"), ['a', 'b']));

  it('stays quoted in every script: sourcing it runs nothing, and the values are still offered', () => {
    for (const shell of ['bash', 'zsh', 'fish'] as const) writeFileSync(join(dir, `evil.${shell}`), completionScript(program, shell));
    const r = sh('bash', ['--norc', '-c', 'source "$1"; COMP_WORDS=(evil sub --mode ""); COMP_CWORD=3; __evil_complete; printf "%s\\n" "${COMPREPLY[@]}"; __evil_complete; COMP_WORDS=(evil ""); COMP_CWORD=1; __evil_complete; printf "%s\\n" "${COMPREPLY[@]}"', 'bash', join(dir, 'evil.bash')]);
    expect(r.stdout).toBe('a\nb\nsub\n');
    expect(sh('zsh', ['-n', join(dir, 'evil.zsh')]).status).toBe(0);
    expect(sh('fish', ['--no-config', '-c', 'source $argv[1]; complete -C "evil "', join(dir, 'evil.fish')]).stdout).toContain('sub\tit');
    expect(existsSync(marker)).toBe(false);
  });

  it('is text in the manual page: no request from a leading ".", backslashes and quotes printed as they are', () => {
    const page = manPage(program);
    const check = sh('groff', ['-man', '-ww', '-z'], page);
    expect(check.stderr).toBe('');
    const text = sh('groff', ['-man', '-Tascii', '-P', '-cbou'], page).stdout;
    expect(text).toMatch(/\.SH\s+INJECTED/);
    expect(text).toContain('back\\slash');
    expect(text).not.toMatch(/^INJECTED/m);
    expect(roffText('.TH x\n\'br')).toBe("\\&.TH x\n\\&'br");
  });
});

describe('manual pages', () => {
  it('each program prints one (hidden from --help) that groff reads without a warning, listing every command', () => {
    for (const p of PROGRAMS) {
      const r = sh(process.execPath, [bin(p), 'man']);
      expect(r.status, p).toBe(0);
      const check = sh('groff', ['-man', '-ww', '-z'], r.stdout);
      expect(check.stderr, p).toBe('');
      expect(check.status).toBe(0);
      for (const section of ['NAME', 'SYNOPSIS', 'DESCRIPTION', 'OPTIONS', 'EXIT STATUS', 'SEE ALSO']) expect(r.stdout, `${p} ${section}`).toContain(`.SH ${section}`);
      const text = sh('groff', ['-man', '-Tascii', '-P', '-cbou'], r.stdout).stdout;
      for (const c of helpCommands(p)) expect(text, `${p} ${c}`).toContain(c);
      expect(helpCommands(p)).not.toContain('man');
    }
    const gwctl = sh('groff', ['-man', '-Tascii', '-P', '-cbou'], sh(process.execPath, [bin('gwctl'), 'man']).stdout).stdout;
    expect(gwctl).toContain('users add');
    expect(gwctl).toMatch(/-f, --format format: output format[^)]*\)\s+\(one\s+of:\s+text,\s+json,\s+yaml\)/);
  });

  it('an unknown shell is a usage error naming the shells, exit 2', () => {
    const r = sh(process.execPath, [bin('gwctl'), 'completion', 'tcsh']);
    expect(r.status).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toMatch(/bash, zsh, fish/);
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
  });
});

describe('positional options (gwsh: the program\'s options only before a subcommand)', () => {
  it('offers the program\'s options before a subcommand and not after it', () => {
    expect(bashComplete('gwsh', ['gwsh', '--'])).toContain('--debug');
    const afterSsh = bashComplete('gwsh', ['gwsh', 'status', '--']);
    expect(afterSsh).toContain('--format');
    expect(afterSsh).not.toContain('--version');
    // --debug is each command's own too (gwsh proxy app X --debug), except ssh's, whose flags are OpenSSH's.
    expect(afterSsh).toContain('--debug');
    // gwctl reads its options anywhere: they stay offered after a subcommand.
    expect(bashComplete('gwctl', ['gwctl', 'status', '--'])).toContain('--data-dir');
  });
});

describe('an oversized command line', () => {
  it(`gets no completion past ${MAX_WORDS} words instead of a walk over all of them, in every shell`, () => {
    const many = Array.from({ length: 5_000 }, () => 'x');
    expect(bashComplete('gwctl', ['gwctl', ...many, ''])).toEqual([]);
    expect(zshComplete('gwctl', ['gwctl', ...many, ''])).toEqual([]);
    expect(fishComplete('gwctl', `gwctl ${many.join(' ')} `)).toEqual([]);
    // just below the bound it still completes
    expect(bashComplete('gwctl', ['gwctl', 'status', ...Array.from({ length: MAX_WORDS - 3 }, () => 'x'), '-f', ''])).toEqual(['text', 'json', 'yaml']);
  });
});
