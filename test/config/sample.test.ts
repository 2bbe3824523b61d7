import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { defaultConfig, enabledServices, parseConfig, sampleConfig, SCHEMA } from '../../src/config/index.js';
import { referenceRows } from '../../src/config/sample.js';
import { ERROR_CODES } from '../../src/errors.js';

const DOCS = readFileSync(new URL('../../docs/configuration.md', import.meta.url), 'utf8');

/** The sample with every commented-out key ("# key: value") switched on. */
function uncommented(sample: string): string {
  return sample
    .split('\n')
    .map((line) => line.replace(/^(\s*)# ([A-Za-z0-9._/-]+:(?:\s.*)?)$/, '$1$2'))
    .join('\n');
}

describe('sampleConfig', () => {
  const sample = sampleConfig();

  it('parses to the defaults', () => {
    expect(parseConfig(sample, 'sample.yaml')).toEqual(defaultConfig());
  });

  it('shows every key of the schema', () => {
    for (const { path } of referenceRows()) {
      const key = path.split('.').pop()!;
      if (key.startsWith('<')) continue; // a user-chosen name: shown through the example entries
      if (path.includes('[]')) continue; // fields of list items: the list is shown (empty by default); docs/configuration.md has them
      expect(sample, path).toMatch(new RegExp(`^\\s*(# )?${key}:`, 'm'));
    }
    for (const section of Object.keys(SCHEMA.fields)) expect(sample).toMatch(new RegExp(`^${section}:$`, 'm'));
  });

  it('comments every key', () => {
    const keyLines = sample.split('\n').filter((l) => /^\s+(# )?[A-Za-z0-9._/-]+:/.test(l));
    for (const line of keyLines) {
      if (/^\s+# [a-z]+\/[a-z]+:$/.test(line)) continue;
      expect(line, line).toMatch(/ # \S/);
    }
  });

  it('still parses with the commented-out keys switched on', () => {
    // The PostgreSQL keys of gateway.storage come with type: postgres (for sqlite they are an error).
    const on = parseConfig(uncommented(sample).replace(/^(\s+type: )sqlite\b/m, '$1postgres'), 'sample.yaml');
    expect(on.gateway.storage.type).toBe('postgres');
    expect(on.gateway.storage.conn_string).toBe('postgresql://gateway@db.internal:5432/gateway?sslmode=verify-full');
    expect(on.proxy_service.kube_listen_addr).toEqual({ host: '0.0.0.0', port: 3026 });
    expect(on.gateway.log.format).toBe('json');
    expect(Object.keys(on.proxy_service.automatic_upgrades_channels).sort()).toEqual(['default', 'stable/rolling']);
    expect(on.gateway.nodename).toBe(defaultConfig().gateway.nodename);
    expect(enabledServices(on)).toEqual(['auth_service', 'proxy_service']);
  });
});

describe('sampleConfig list examples', () => {
  const sample = sampleConfig();

  it.each([
    ['databases', (c: ReturnType<typeof parseConfig>) => c.db_service.databases],
    ['apps', (c: ReturnType<typeof parseConfig>) => c.app_service.apps],
    ['clusters', (c: ReturnType<typeof parseConfig>) => c.kube_service.clusters],
    ['desktops', (c: ReturnType<typeof parseConfig>) => c.windows_desktop_service.desktops],
  ] as const)('%s: an empty list with one commented-out entry that parses when switched on', (key, get) => {
    const lines = sample.split('\n');
    const at = lines.findIndex((l) => new RegExp(`^  ${key}: \\[\\]`).test(l));
    expect(at, key).toBeGreaterThan(0);
    expect(lines[at + 1]).toMatch(/^    # - name: /);
    // Switch it on as an operator would: drop "[]" and the "# " of the entry.
    const on = lines.map((l, i) => (i === at ? l.replace(' []', '') : i > at && /^    # [ -] /.test(l) ? l.replace('# ', '') : l));
    let end = at + 1;
    while (/^    # [ -] /.test(lines[end] ?? '')) end++;
    const edited = [...on.slice(0, end), ...lines.slice(end)].join('\n');
    expect(get(parseConfig(edited, 'sample.yaml'))).toHaveLength(1);
  });
});

describe('docs/configuration.md', () => {
  const escape = (s: string): string => s.replace(/\|/g, '\\|');
  const rows = (path: string): string[] => DOCS.split('\n').filter((l) => l.startsWith(`| \`${path}\` |`));

  it.each(referenceRows().map((r) => [r.path, r] as const))('documents %s with its type and default', (path, row) => {
    const expected = `| \`${path}\` | ${escape(row.type)} | ${escape(row.default || '—')} |`;
    // The message is the row to paste into the docs when this fails.
    expect(rows(path).some((l) => l.startsWith(expected)), `docs/configuration.md needs: ${expected} ${escape(row.doc)} |`).toBe(true);
  });

  it('has no row for a key the schema does not have', () => {
    const known = new Set(referenceRows().map((r) => r.path));
    const documented = DOCS.split('\n')
      .map((l) => /^\| `([a-z_]+(?:\.[^`]+)?)` \| (?:section|[^|]*?[a-z])/.exec(l)?.[1])
      .filter((p): p is string => p !== undefined && p.includes('.'));
    expect(documented.filter((p) => !known.has(p))).toEqual([]);
  });

  it('lists every configuration error code', () => {
    for (const code of Object.keys(ERROR_CODES).filter((c) => c.startsWith('GW_ERR_CONFIG_'))) expect(DOCS).toContain(`\`${code}\``);
  });

  it('has YAML examples that parse', () => {
    const blocks = [...DOCS.matchAll(/```yaml\n([\s\S]*?)```/g)].map((m) => m[1]!);
    expect(blocks.length).toBeGreaterThan(0);
    for (const block of blocks) expect(() => parseConfig(block, 'docs')).not.toThrow();
  });
});
