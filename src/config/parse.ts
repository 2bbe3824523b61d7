/**
 * Configuration file → validated, frozen GatewayConfig. Every problem is reported as
 * `<source>:<line>:<column>: <key path>: <what was expected, what was found>`; all problems of a file are
 * collected into one GatewayError whose code is that of the first problem in the file.
 */
import { readFileSync } from 'node:fs';
import { LineCounter, isMap, isScalar, parseDocument, type YAMLError } from 'yaml';
import { GatewayError } from '../errors.js';
import { SCHEMA, SERVICE_NAMES } from './schema.js';
import { Ctx, keyIndex, type AnySpec, type Issue } from './spec.js';
import type { GatewayConfig, ServiceName } from './types.js';

const KEY_INDEX = keyIndex(SCHEMA as AnySpec);

/** Parses and validates configuration text. source names the text in messages (usually the file path). */
export function parseConfig(text: string, source: string): GatewayConfig {
  const lines = new LineCounter();
  // uniqueKeys off: duplicate keys are reported by the walk, which knows their key path.
  const doc = parseDocument(text, { lineCounter: lines, uniqueKeys: false, prettyErrors: false });
  const ctx = new Ctx(text, doc, lines, KEY_INDEX);
  if (doc.errors.length > 0) {
    for (const err of doc.errors) reportSyntax(ctx, err, text, lines);
    throw toError(ctx.issues, source);
  }
  const root = ctx.deref(doc.contents, '');
  if (isMap(root)) {
    const keys = root.items.map((pair) => (isScalar(pair.key) ? pair.key.value : undefined));
    ctx.present = new Set(keys.filter((k): k is string => typeof k === 'string'));
  }
  const config = SCHEMA.resolve(root, '', ctx);
  if (ctx.issues.length > 0) throw toError(ctx.issues, source);
  return deepFreeze(config);
}

/** Reads a configuration file (GW_ERR_CONFIG_READ when that fails) and parses it. */
export function loadConfigFile(path: string): GatewayConfig {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    // "ENOENT: no such file or directory, open '/x'" → "no such file or directory (ENOENT)"
    const reason = /^[A-Z0-9_]+: (.*?), \w+(?: '.*')?$/s.exec(e.message)?.[1] ?? e.message;
    throw new GatewayError('GW_ERR_CONFIG_READ', `cannot read configuration file ${path}: ${reason}${e.code ? ` (${e.code})` : ''}`, {
      cause: err,
      details: { source: path, ...(e.code ? { errno: e.code } : {}) },
    });
  }
  return parseConfig(text, path);
}

/** The configuration `gateway start` uses without -c: Auth Service and Proxy Service, no agents. */
export function defaultConfig(): GatewayConfig {
  return deepFreeze(SCHEMA.resolve(undefined, '', new Ctx()));
}

/** The services `gateway start` runs for this configuration, in table order. */
export function enabledServices(config: GatewayConfig): ServiceName[] {
  return SERVICE_NAMES.filter((name) => config[name].enabled);
}

function reportSyntax(ctx: Ctx, err: YAMLError, text: string, lines: LineCounter): void {
  const lineText = text.split('\n')[lines.linePos(err.pos[0]).line - 1] ?? '';
  const hint =
    err.code === 'TAB_AS_INDENT'
      ? 'Indent with spaces; YAML does not allow tabs for indentation.'
      : /:\s*\[[0-9a-fA-F:.]*\]/.test(lineText)
        ? 'Put addresses that start with "[" in quotes: listen_addr: "[::1]:3025".'
        : undefined;
  ctx.reportAt('GW_ERR_CONFIG_SYNTAX', '', err.pos[0], err.message.replace(/\s+/g, ' ').trim(), hint);
}

const MAX_LISTED = 10;

function toError(issues: readonly Issue[], source: string): GatewayError {
  const sorted = [...issues].sort((a, b) => a.line - b.line || a.column - b.column);
  const first = sorted[0]!;
  const format = (i: Issue): string => `${source}:${i.line}:${i.column}: ${i.path === '' ? '' : `${i.path}: `}${i.problem}`;
  let message = format(first);
  if (sorted.length > 1) {
    const more = sorted.slice(1, MAX_LISTED + 1).map((i) => `\n  ${format(i)}`);
    const rest = sorted.length - 1 - more.length;
    message += `\nand ${sorted.length - 1} more problem${sorted.length > 2 ? 's' : ''}:${more.join('')}${rest > 0 ? `\n  ...` : ''}`;
  }
  return new GatewayError(first.code, message, {
    hint: first.hint,
    details: {
      path: first.path,
      line: first.line,
      column: first.column,
      source,
      problems: sorted.map((i) => ({ code: i.code, path: i.path, line: i.line, column: i.column, message: format(i) })),
    },
  });
}

function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const v of Object.values(value)) deepFreeze(v);
  }
  return value;
}
