/**
 * A program's manual page (man(7) roff), generated from its commander definition (cmdtree.ts) and printed by its
 * hidden `man` command; the packages install it as /usr/share/man/man1/<program>.1.gz (scripts/package/layout.mjs).
 *
 * One page per program: NAME, SYNOPSIS, DESCRIPTION, OPTIONS (the program's), COMMANDS (every subcommand with its
 * arguments and options), EXIT STATUS (run.ts's), ENVIRONMENT and FILES (given by the program), SEE ALSO.
 *
 * Why roff by hand and not a library: the ones that write man pages (marked-man, remark-man) convert Markdown, so
 * the definitions would go through Markdown first, and their escaping of what the text holds is theirs to get right;
 * the subset written here is six macros (.TH .SH .TP .B .I .PP) and one escaping rule, checked by groff -ww in the
 * tests: every text line starts with \& (a "." or "'" from a description is never a request), a backslash is \e,
 * a "-" is \- (a real minus, as options are typed), anything outside ASCII is \[uXXXX].
 */
import { EXIT_FAILURE, EXIT_USAGE, VERSION } from './run.js';
import { allCommands, commandTree, type ArgSpec, type CommandSpec, type OptionSpec } from './cmdtree.js';

export interface ManPageInfo {
  /** Paragraphs after the one-line description. */
  description?: string[];
  /** Environment variables the program reads: [name, what it does]. */
  environment?: Array<[string, string]>;
  /** Files it reads or writes: [path, what it is]. */
  files?: Array<[string, string]>;
  /** Other pages: "gwctl(1)". */
  seeAlso?: string[];
}

/** Text escaped for roff, as one or more text lines that cannot start a request. */
export function roffText(s: string): string {
  const escaped = s
    .replace(/\\/g, '\\e')
    .replace(/-/g, '\\-')
    .replace(/[^\x20-\x7e\n]/gu, (c) => `\\[u${c.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}]`);
  return escaped
    .split('\n')
    .map((l) => `\\&${l}`)
    .join('\n');
}

const bold = (s: string): string => `\\fB${roffText(s).slice(2)}\\fR`;
const italic = (s: string): string => `\\fI${roffText(s).slice(2)}\\fR`;

function optionTerm(o: OptionSpec): string {
  const value = o.value === undefined ? '' : ` ${o.valueOptional ? '[' : ''}${italic(o.value)}${o.valueOptional ? ']' : ''}`;
  return `${o.flags.map(bold).join(', ')}${value}`;
}

/** The description, with the values when they are a fixed list. */
function optionText(o: OptionSpec): string {
  return roffText(`${o.description}${o.hint?.kind === 'choices' ? ` (one of: ${o.hint.values.join(', ')})` : ''}`);
}

function optionsBlock(options: OptionSpec[]): string[] {
  return options.flatMap((o) => ['.TP', optionTerm(o), optionText(o)]);
}

function argWords(args: ArgSpec[]): string {
  return args.map((a) => (a.required ? italic(a.name) : `[${italic(a.name)}]`) + (a.variadic ? '...' : '')).join(' ');
}

function commandBlock(c: CommandSpec): string[] {
  const words = c.path.slice(1).map(bold).join(' ');
  const lines = ['.TP', `${words}${c.options.length > 0 ? ' [options]' : ''}${c.args.length > 0 ? ` ${argWords(c.args)}` : ''}`];
  lines.push(roffText(c.description || '(no description)'));
  if (c.aliases.length > 0) lines.push('.br', roffText(`Also: ${c.aliases.join(', ')}.`));
  for (const a of c.args.filter((x) => x.description)) lines.push('.br', `${italic(a.name)}: ${roffText(a.description).slice(2)}`);
  for (const o of c.options) lines.push('.br', `${optionTerm(o)}: ${optionText(o).slice(2)}`);
  return lines;
}

/** The manual page of a program. */
export function manPage(program: Parameters<typeof commandTree>[0], info: ManPageInfo = {}): string {
  const root = commandTree(program);
  const name = root.name;
  const lines = [
    `.\\" ${name}(1): generated from the command definitions by \`${name} man\`; do not edit.`,
    `.TH ${name.toUpperCase().replace(/-/g, '\\-')} 1 "" "Gateway ${roffText(VERSION).slice(2)}" "Gateway Manual"`,
    '.SH NAME',
    `${roffText(name).slice(2)} \\- ${roffText(root.description).slice(2)}`,
    '.SH SYNOPSIS',
    `${bold(name)} [options] ${root.commands.length > 0 ? `${italic('command')} [options] [arguments]` : argWords(root.args)}`,
    '.SH DESCRIPTION',
    roffText(root.description),
    ...(info.description ?? []).flatMap((p) => ['.PP', roffText(p)]),
    '.SH OPTIONS',
    ...optionsBlock(root.options),
  ];
  const commands = allCommands(root).slice(1);
  if (commands.length > 0) lines.push('.SH COMMANDS', ...commands.flatMap(commandBlock));
  lines.push(
    '.SH EXIT STATUS',
    '.TP',
    bold('0'),
    roffText('Success.'),
    '.TP',
    bold(String(EXIT_FAILURE)),
    roffText('The operation failed: standard error has an error: line, a hint: line naming the fix and a code: line (docs/errors.md lists the codes).'),
    '.TP',
    bold(String(EXIT_USAGE)),
    roffText('The command line cannot be understood (an unknown option, a missing argument, a bad --format).'),
  );
  if (info.environment && info.environment.length > 0) lines.push('.SH ENVIRONMENT', ...info.environment.flatMap(([n, d]) => ['.TP', bold(n), roffText(d)]));
  if (info.files && info.files.length > 0) lines.push('.SH FILES', ...info.files.flatMap(([n, d]) => ['.TP', italic(n), roffText(d)]));
  const seeAlso = info.seeAlso ?? [];
  if (seeAlso.length > 0) lines.push('.SH SEE ALSO', seeAlso.map((s) => `${bold(s.replace(/\(\d\)$/, ''))}${/\(\d\)$/.exec(s)?.[0] ?? ''}`).join(', '));
  return `${lines.join('\n')}\n`;
}

/** The Dialer's variables, read by every program that dials out (docs/dialing.md). */
export const PROXY_ENVIRONMENT: Array<[string, string]> = [
  ['HTTPS_PROXY, HTTP_PROXY, ALL_PROXY', 'An HTTP CONNECT (or SOCKS5) proxy every outbound connection goes through; credentials in the URL (Basic, Digest, NTLM) or Kerberos for Negotiate.'],
  ['NO_PROXY', 'Hosts, domains and networks dialled directly.'],
];
