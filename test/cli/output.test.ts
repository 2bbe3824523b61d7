/** The one output flag (src/cli/output.ts): what each value means, the deprecated spellings, the renderers. */
import { Command } from 'commander';
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml, parseAllDocuments } from 'yaml';
import { formatOf, formatOption, render, renderRecord } from '../../src/cli/output.js';
import { codeOf } from '../helpers/errors.js';

function stderr(): { stream: PassThrough; text: () => string } {
  const stream = new PassThrough();
  let text = '';
  stream.on('data', (c: Buffer) => (text += c.toString()));
  return { stream, text: () => text };
}

/** Parses argv with a command that declares the flag, and answers the format it chose. */
function chosen(argv: string[], spec: Parameters<typeof formatOf>[1] = {}): { format: string; notice: string } {
  const err = stderr();
  let format = '';
  const cmd = formatOption(new Command('x').exitOverride(), spec).action((opts: { format?: string; json?: boolean }) => {
    format = formatOf(opts, spec, err.stream);
  });
  cmd.parse(argv, { from: 'user' });
  return { format, notice: err.text() };
}

describe('-f, --format', () => {
  it('text, json and yaml, in the long and the short form; text unless the command says otherwise', () => {
    expect(chosen([]).format).toBe('text');
    expect(chosen(['-f', 'json']).format).toBe('json');
    expect(chosen(['--format', 'yaml']).format).toBe('yaml');
    expect(chosen(['--format=text']).format).toBe('text');
    expect(chosen([], { default: 'yaml' }).format).toBe('yaml');
  });

  it('a value outside the list is GW_ERR_OUTPUT_FORMAT naming every format', async () => {
    for (const bad of ['xml', 'JSON', 'table', '', 'json ', '__proto__']) {
      expect(await codeOf(Promise.resolve().then(() => chosen(['-f', bad])))).toBe('GW_ERR_OUTPUT_FORMAT');
    }
    expect(() => chosen(['-f', 'xml'])).toThrow(/text, json, yaml/);
    // An oversized value is not echoed whole.
    expect(() => chosen(['-f', 'x'.repeat(10_000)])).toThrow(/^--format: "x{40}" is not/);
  });

  it('--json is a deprecated spelling of --format json, where the command had it: a notice on stderr', () => {
    expect(chosen(['--json'], { jsonFlag: true })).toEqual({ format: 'json', notice: 'warning: --json is deprecated; use --format json (or -f json)\n' });
    expect(chosen(['--json', '-f', 'json'], { jsonFlag: true }).format).toBe('json');
    expect(() => chosen(['--json', '-f', 'yaml'], { jsonFlag: true })).toThrow(/two different formats/);
    expect(() => chosen(['--json', '-f', 'text'], { jsonFlag: true })).toThrow(/two different formats/);
    // Not declared where the command never had it.
    expect(() => chosen(['--json'])).toThrow(/unknown option/);
  });

  it('an old value of --format maps to its format with a notice', () => {
    expect(chosen(['-f', 'table'], { default: 'yaml', aliases: { table: 'text' } })).toEqual({ format: 'text', notice: 'warning: --format table is deprecated; use --format text\n' });
    // Object.prototype's names are no aliases.
    expect(() => chosen(['-f', 'constructor'], { aliases: { table: 'text' } })).toThrow(/not an output format/);
  });
});

describe('render', () => {
  const data = { cluster_name: 'a', roles: ['x', 'y'], valid_until: '2030-01-01T00:00:00Z', yes: 'no' };

  it('json and yaml are the same data; text is the command own', () => {
    expect(JSON.parse(render('json', data, () => 'unused'))).toEqual(data);
    expect(parseYaml(render('yaml', data, () => 'unused'))).toEqual(data);
    expect(render('text', data, () => 'Cluster: a')).toBe('Cluster: a\n');
  });

  it('records: a JSON line each, or a YAML document each', () => {
    const records = [{ target: 'a:1', proxy: null }, { target: 'b:2', error: { code: 'X', message: 'multi\nline' } }];
    const json = records.map((r, i) => renderRecord('json', r, i === 0)).join('');
    expect(json.trimEnd().split('\n').map((l) => JSON.parse(l) as unknown)).toEqual(records);
    const yaml = records.map((r, i) => renderRecord('yaml', r, i === 0)).join('');
    expect(parseAllDocuments(yaml).map((d) => d.toJS() as unknown)).toEqual(records);
  });
});
