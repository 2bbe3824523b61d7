/** `gwctl get KIND -f text` (src/cli/resources.ts): a table per kind, and hostile text kept off the terminal. */
import { describe, expect, it } from 'vitest';
import type { Resource } from '../../src/auth/resources/index.js';
import { resourceTable } from '../../src/cli/resources.js';

const res = (kind: string, name: string, spec: unknown, metadata: Record<string, unknown> = {}): Resource => ({ kind, version: 'v1', metadata: { name, ...metadata }, spec }) as Resource;

describe('resourceTable', () => {
  it('roles: logins, node labels, how many rules, description', () => {
    const text = resourceTable('role', [res('access', 'access', { allow: { logins: ['{{internal.logins}}'], node_labels: { '*': '*' }, rules: [{}, {}] } }, { description: 'shells' })]);
    expect(text.split('\n')).toEqual([expect.stringMatching(/^Role\s+Logins\s+Node labels\s+Rules\s+Description$/), expect.stringMatching(/^access\s+\{\{internal\.logins\}\}\s+\*=\*\s+2\s+shells$/)]);
  });

  it('tokens: id, types, uses as used/allowed (any for 0), expiry', () => {
    const text = resourceTable('token', [res('token', 'abc', { roles: ['node', 'app'], uses: 0, used: 3 }, { expires: '2030-01-01T00:00:00.000Z' })]);
    expect(text.split('\n')[1]).toMatch(/^abc\s+node,app\s+3\/any\s+2030-01-01T00:00:00.000Z$/);
  });

  it('connectors: their mappings to roles; the maintenance window: every day without weekdays', () => {
    expect(resourceTable('github', [res('github', 'gh', { display: 'GitHub', teams_to_roles: [{ organization: 'o', team: 'admins', roles: ['editor', 'access'] }] })])).toMatch(/^gh\s+GitHub\s+admins->editor,access$/m);
    expect(resourceTable('cluster_maintenance_config', [res('cluster_maintenance_config', 'cluster-maintenance-config', { agent_upgrades: { utc_start_hour: 3 } })])).toMatch(/3\s+every day$/m);
  });

  it('control characters from a manifest or an agent never reach the terminal, and a cell has a bound', () => {
    const text = resourceTable('node', [res('node', 'h\u001b[2J\u001b[H', { hostname: `evil\r\u0007${'x'.repeat(500)}`, status: 'online\u009b31m' }, { labels: { 'a\u001b': 'b\n' } })]);
    // eslint-disable-next-line no-control-regex
    expect(text).not.toMatch(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/);
    expect(text.split('\n')).toHaveLength(2);
    expect(Math.max(...text.split('\n')[1]!.split(/\s{2,}/).map((c) => c.length))).toBeLessThanOrEqual(80);
  });

  it('a kind without columns, or a name of Object.prototype, gets kind and name', () => {
    expect(resourceTable('constructor', [res('x', 'n', {})])).toMatch(/^Kind\s+Name\nx\s+n$/);
    expect(resourceTable('__proto__', [res('x', 'n', {})])).toMatch(/^Kind\s+Name\nx\s+n$/);
  });

  it('events are the audit table', () => {
    expect(resourceTable('event', [res('event', '1', { time: 't', event: 'user.login', user: 'alice' })]).split('\n')[0]).toMatch(/^TIME\s+EVENT\s+USER/);
  });
});
