/**
 * The one output flag of every command that prints data: `-f, --format <text|json|yaml>` (docs/cli.md#output).
 * A command declares it with formatOption (never its own --format), reads the chosen format with formatOf, and
 * prints with render: text is the command's own (tables of table.ts, lines), json and yaml are the same data with
 * the same snake_case keys (the yaml package writes YAML; nothing here escapes or quotes by hand).
 *
 * Old spellings that scripts may hold keep working as deprecated aliases, each with a one-line notice on standard
 * error so that standard output stays the data: `--json` (gateway dial-plan), `--format table` (gwctl get events).
 * A value outside the list is GW_ERR_OUTPUT_FORMAT naming the accepted values, before anything is asked or printed.
 */
import { Option, type Command } from 'commander';
import { stringify } from 'yaml';
import { GatewayError } from '../errors.js';
import { completeValues } from './cmdtree.js';

export const FORMATS = ['text', 'json', 'yaml'] as const;
export type Format = (typeof FORMATS)[number];

export interface FormatSpec {
  /** The format without the flag (text unless the command says otherwise: gwctl get prints YAML, as upstream's does). */
  default?: Format;
  /** Old values of --format that mean one of the formats (deprecated, with a notice). */
  aliases?: Readonly<Record<string, Format>>;
  /** The command had a --json flag: it stays, as a deprecated spelling of --format json. */
  jsonFlag?: boolean;
  /** false: --format only, for a command whose -f is its file (gwctl apply -f FILE, as kubectl apply -f). */
  shortFlag?: false;
}

export interface FormatOptions {
  format?: string;
  json?: boolean;
}

/** Declares -f, --format (and the deprecated --json where the command had it) on a command. */
export function formatOption(cmd: Command, spec: FormatSpec = {}): Command {
  // No commander default: an absent flag stays undefined, so that --json beside an explicit -f text is seen.
  // The values are offered by completion and listed in the manual (completeValues), not enforced by commander:
  // formatOf checks them, so that the deprecated aliases keep working.
  const flags = spec.shortFlag === false ? '--format <format>' : '-f, --format <format>';
  cmd.addOption(completeValues(new Option(flags, `output format: ${FORMATS.join(', ')} (default: ${spec.default ?? 'text'})`), FORMATS));
  if (spec.jsonFlag) cmd.addOption(new Option('--json', 'deprecated: use --format json'));
  return cmd;
}

/** The format the user chose; a notice on stderr for a deprecated spelling; GW_ERR_OUTPUT_FORMAT for anything else. */
export function formatOf(opts: FormatOptions, spec: FormatSpec = {}, stderr: NodeJS.WritableStream = process.stderr): Format {
  const given = opts.format ?? spec.default ?? 'text';
  if (opts.json) {
    if (opts.format !== undefined && opts.format !== 'json') {
      throw new GatewayError('GW_ERR_OUTPUT_FORMAT', `--json and --format ${opts.format} ask for two different formats`, { hint: 'Give only --format (-f): text, json or yaml.' });
    }
    stderr.write('warning: --json is deprecated; use --format json (or -f json)\n');
    return 'json';
  }
  if ((FORMATS as readonly string[]).includes(given)) return given as Format;
  // Own keys only: "constructor" is no alias of anything.
  const alias = spec.aliases && Object.hasOwn(spec.aliases, given) ? spec.aliases[given] : undefined;
  if (alias !== undefined) {
    stderr.write(`warning: --format ${given} is deprecated; use --format ${alias}\n`);
    return alias;
  }
  throw new GatewayError('GW_ERR_OUTPUT_FORMAT', `--format: "${given.slice(0, 40)}" is not an output format; the formats are ${FORMATS.join(', ')}`, {
    hint: `Give one of: ${FORMATS.map((f) => `-f ${f}`).join(', ')}.`,
  });
}

/** JSON (two-space indented) or YAML of data, or the command's text; always one trailing newline. */
export function render(format: Format, data: unknown, text: () => string): string {
  const out = format === 'json' ? JSON.stringify(data, null, 2) : format === 'yaml' ? stringify(data, { lineWidth: 0 }) : text();
  return out.endsWith('\n') ? out : `${out}\n`;
}

/**
 * A stream of records, one per step (gateway dial-plan prints each target as it is decided, a probe may take
 * seconds): JSON as one object per line, YAML as one document per record.
 */
export function renderRecord(format: Exclude<Format, 'text'>, record: unknown, first: boolean): string {
  if (format === 'json') return `${JSON.stringify(record)}\n`;
  return `${first ? '' : '---\n'}${stringify(record, { lineWidth: 0 })}`;
}
