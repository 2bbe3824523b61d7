/**
 * The Web UI's logic that needs no browser (web/src/lib/): the filter, times and windows, routes and redirects,
 * error mapping, the maintenance manifest, the terminal protocol, the bearer store, audit rows. Each part has
 * its hostile case: what a user types, what a server or something in front of it answers, what a page is handed.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { codeBlocks } from '../helpers/shell.js';
import { eventSummary } from '../../web/src/lib/audit.js';
import { BearerStore, type KeyValueStore } from '../../web/src/lib/bearer.js';
import { clearsData, failureFrom, signInReason, unreachable } from '../../web/src/lib/errors.js';
import { addChipToQuery, filterItems, labelChips, MAX_TERMS, parseQuery } from '../../web/src/lib/filter.js';
import { joinCommand } from '../../web/src/lib/join.js';
import { maintenanceManifest, maintenanceRoleSteps, upgradesOf } from '../../web/src/lib/manifest.js';
import { appLaunchStart, launchParams, launchUrlFits, matchRoute, safeRedirect } from '../../web/src/lib/route.js';
import { clampSize, exitLine, openableLink, parseServerMessage, resizeMessage, subprotocols, terminalUrl } from '../../web/src/lib/terminal.js';
import { formatWindow, nextWindow, relative, utcStamp } from '../../web/src/lib/time.js';

const nodes: Array<{ name: string; labels: Record<string, string>; text: string[] }> = [
  { name: 'web-1', labels: { env: 'prod', team: 'web' }, text: ['web-1.internal'] },
  { name: 'web-2', labels: { env: 'staging', team: 'web' }, text: ['web-2.internal'] },
  { name: 'db', labels: { env: 'prod', region: 'eu west' }, text: ['bastion'] },
];
const names = (q: string) => filterItems(nodes, q).map((n) => n.name);

describe('the resource filter', () => {
  it('matches names and other text, case-insensitively; an empty query keeps every row', () => {
    expect(names('')).toEqual(['web-1', 'web-2', 'db']);
    expect(names('WEB')).toEqual(['web-1', 'web-2']);
    expect(names('bastion')).toEqual(['db']);
  });

  it('key=value matches a label exactly (not a prefix of the value); key= any value of that label', () => {
    expect(names('env=prod')).toEqual(['web-1', 'db']);
    expect(names('env=pro')).toEqual([]);
    expect(names('region=')).toEqual(['db']);
    expect(names('ENV=Prod team=web')).toEqual(['web-1']);
  });

  it('quotes keep a space inside a term, and a chip with a space is added quoted', () => {
    expect(names('"region=eu west"')).toEqual(['db']);
    expect(addChipToQuery('web', 'region=eu west')).toBe('web "region=eu west"');
    expect(addChipToQuery('env=prod', 'env=prod')).toBe('env=prod');
    expect(labelChips({ z: '1', a: '2' })).toEqual(['a=2', 'z=1']);
  });

  it('hostile input: regular-expression characters are literal, a huge paste is cut, terms are capped', () => {
    expect(names('.*')).toEqual([]);
    expect(names('(')).toEqual([]);
    expect(names('=prod')).toEqual(['web-1', 'db']); // "=" first: a text term (found in "env=prod"), not a label with an empty key
    const huge = 'x'.repeat(100_000);
    expect((parseQuery(huge)[0] as { value: string }).value.length).toBeLessThanOrEqual(256);
    expect(parseQuery(Array.from({ length: 100 }, (_, i) => `t${i}`).join(' '))).toHaveLength(MAX_TERMS);
    expect(names('"unterminated')).toEqual([]);
    // labels from the server that are not strings do not throw
    expect(filterItems([{ name: 'n', labels: { a: 1 as unknown as string } }], 'a=1')).toHaveLength(1);
  });
});

describe('times and maintenance windows', () => {
  const now = Date.parse('2026-11-24T23:00:00Z'); // a Tuesday

  it('relative times and UTC stamps', () => {
    expect(relative(now + 5 * 3600_000 + 60_000, now)).toBe('in 5 h 1 min');
    expect(relative(now - 120_000, now)).toBe('2 min ago');
    expect(relative(now + 30_000, now)).toBe('now');
    expect(relative(now + 2 * 86_400_000, now)).toBe('in 2 d');
    expect(utcStamp('2026-11-24T03:05:00Z')).toBe('Tue 2026-11-24 03:05 UTC');
    expect(utcStamp('2026-11-24T03:05:07Z', { seconds: true })).toBe('Tue 2026-11-24 03:05:07 UTC');
    expect(utcStamp('not a time')).toBe('—');
  });

  it('a window from the server: same day, open now, across midnight, absent or malformed', () => {
    expect(formatWindow({ start: '2026-11-25T03:00:00Z', end: '2026-11-25T04:00:00Z' }, now)).toBe('Wed 2026-11-25 03:00–04:00 UTC (in 4 h)');
    expect(formatWindow({ start: '2026-11-24T22:30:00Z', end: '2026-11-24T23:30:00Z' }, now)).toContain('(open now)');
    expect(formatWindow({ start: '2026-11-24T23:30:00Z', end: '2026-11-25T00:30:00Z' }, now)).toBe('Tue 2026-11-24 23:30–Wed 2026-11-25 00:30 UTC (in 30 min)');
    expect(formatWindow(null, now)).toBe('none');
    expect(formatWindow({ start: 'x', end: 'y' }, now)).toBe('none');
    expect(formatWindow({ start: '2026-11-25T04:00:00Z', end: '2026-11-25T03:00:00Z' }, now)).toBe('none');
  });

  it('the next window of a weekly schedule: the open one counts, next week when today has passed', () => {
    expect(nextWindow(['Wed'], 3, now)).toEqual({ start: Date.parse('2026-11-25T03:00:00Z'), end: Date.parse('2026-11-25T04:00:00Z') });
    expect(nextWindow(['Tue'], 22, now)!.start).toBe(Date.parse('2026-12-01T22:00:00Z')); // 22:00-23:00 ended at now
    expect(nextWindow(['Tue'], 22, now - 1)!.start).toBe(Date.parse('2026-11-24T22:00:00Z')); // still open
    expect(nextWindow([], 3, now)).toBeUndefined();
    expect(nextWindow(['Funday'], 3, now)).toBeUndefined();
    expect(nextWindow(['Mon'], 24, now)).toBeUndefined();
    expect(nextWindow(['Mon'], 1.5, now)).toBeUndefined();
  });
});

describe('routes and the redirect after sign-in', () => {
  it('maps paths to pages', () => {
    expect(matchRoute('/').page).toBe('resources');
    expect(matchRoute('/web/').page).toBe('resources');
    expect(matchRoute('/web/agents/').page).toBe('agents');
    expect(matchRoute('/web/terminal/web%2F1')).toEqual({ page: 'terminal', params: { node: 'web/1' } });
    expect(matchRoute('/web/terminal/%E0%A4%A').page).toBe('not-found');
    expect(matchRoute('/web/nope').page).toBe('not-found');
    expect(matchRoute('/other').page).toBe('not-found');
  });

  it('goes back only to a path of this page, never to another origin', () => {
    expect(safeRedirect('/web/agents?q=x')).toBe('/web/agents?q=x');
    for (const hostile of ['https://evil.example/', '//evil.example/web/', '/\\evil.example', '/web/\\\\evil', 'javascript:alert(1)', '/webapi/sessions', '/web/login?redirect=/web/', '/web/x\nSet-Cookie:', '', null, undefined, `/web/${'a'.repeat(5000)}`]) {
      expect(safeRedirect(hostile)).toBe('/web/');
    }
  });
});

describe('errors as the page shows them', () => {
  it('our JSON error: code, message and hint', () => {
    const body = JSON.stringify({ error: { code: 'GW_ERR_ACCESS_DENIED', message: 'user "bob" may not update', hint: 'Ask an admin.' } });
    expect(failureFrom(403, 'Forbidden', body)).toEqual({ status: 403, code: 'GW_ERR_ACCESS_DENIED', message: 'user "bob" may not update', hint: 'Ask an admin.' });
  });

  it('hostile or foreign answers: an HTML page, a bogus code, a huge body, no body', () => {
    const html = failureFrom(502, 'Bad Gateway', '<html><body><h1>502 Bad Gateway</h1><script>alert(1)</script></body></html>');
    expect(html.code).toBe('');
    expect(html.message).toMatch(/^HTTP 502 Bad Gateway: 502 Bad Gateway/);
    expect(html.message).not.toContain('<');
    expect(html.hint).toMatch(/Proxy/);
    expect(failureFrom(400, '', JSON.stringify({ error: { code: '<img src=x>', message: 'm' } })).code).toBe('');
    expect(failureFrom(500, '', JSON.stringify({ error: { message: 'x'.repeat(100_000) } })).message.length).toBeLessThan(2100);
    expect(failureFrom(500, '', 'y'.repeat(1_000_000)).message.length).toBeLessThan(300);
    expect(failureFrom(401, 'Unauthorized', '')).toMatchObject({ code: '', message: 'HTTP 401 Unauthorized' });
    expect(failureFrom(400, '', '[1,2]').message).toMatch(/^HTTP 400/);
    expect(unreachable(new TypeError('Failed to fetch'))).toMatchObject({ status: 0, message: 'the Proxy could not be reached: Failed to fetch' });
  });

  it('which failures send the page back to sign-in, and what it says there', () => {
    expect(signInReason({ status: 401, code: 'GW_ERR_WEB_SESSION_EXPIRED' })).toBe('expired');
    expect(signInReason({ status: 401, code: 'GW_ERR_WEB_SESSION_INVALID' })).toBe('signed-out');
    expect(signInReason({ status: 401, code: 'GW_ERR_WEB_SESSION_MISSING' })).toBe('signed-out');
    expect(signInReason({ status: 403, code: 'GW_ERR_ACCESS_DENIED' })).toBeUndefined();
    expect(signInReason({ status: 401, code: 'GW_ERR_AUTH_LOGIN_FAILED' })).toBeUndefined();
  });

  it('which failures clear the data on screen: a refusal as the user, not an outage', () => {
    expect(clearsData(failureFrom(403, 'Forbidden', JSON.stringify({ error: { code: 'GW_ERR_ACCESS_LOCKED', message: 'locked' } })))).toBe(true);
    expect(clearsData(failureFrom(403, 'Forbidden', JSON.stringify({ error: { code: 'GW_ERR_ACCESS_DENIED', message: 'no' } })))).toBe(true);
    expect(clearsData(failureFrom(401, 'Unauthorized', ''))).toBe(true);
    expect(clearsData(failureFrom(502, 'Bad Gateway', '<html>down</html>'))).toBe(false);
    expect(clearsData(failureFrom(500, '', '{}'))).toBe(false);
    expect(clearsData(unreachable(new TypeError('Failed to fetch')))).toBe(false);
    // A plain Error (no status): a bug of the page, not a refusal.
    expect(clearsData(new Error('x') as { status?: number })).toBe(false);
  });
});

describe('the maintenance manifest', () => {
  it('writes the weekdays in canonical order and the hour', () => {
    const m = maintenanceManifest(['Thu', 'Tue', 'Tue'], 3);
    expect(m).toContain('kind: cluster_maintenance_config');
    expect(m).toContain('    utc_start_hour: 3\n');
    expect(m).toContain('    weekdays: [Tue, Thu]\n');
    expect(maintenanceManifest([], 0)).toContain('weekdays: []');
  });

  it('hostile: a weekday or hour that would change the manifest is refused before any request', () => {
    expect(() => maintenanceManifest(['Mon]\nkind: role'], 3)).toThrow(/unknown weekday/);
    expect(() => maintenanceManifest(['Mon'], 24)).toThrow(/0\.\.23/);
    expect(() => maintenanceManifest(['Mon'], 2.5)).toThrow(/0\.\.23/);
    expect(() => maintenanceManifest(['Mon'], Number.NaN)).toThrow(/0\.\.23/);
  });

  it('reads the window of the resource; anything malformed is "not set"', () => {
    expect(upgradesOf({ spec: { agent_upgrades: { utc_start_hour: 4, weekdays: ['Sat', 'Mon', 'Bogus'] } } })).toEqual({ utc_start_hour: 4, weekdays: ['Mon', 'Sat'] });
    expect(upgradesOf(undefined)).toBeUndefined();
    expect(upgradesOf({ spec: { agent_upgrades: { utc_start_hour: '4', weekdays: [] } } })).toBeUndefined();
    expect(upgradesOf({ spec: null })).toBeUndefined();
  });
});

describe('the terminal protocol', () => {
  it('URL, subprotocols and resize messages', () => {
    expect(terminalUrl({ protocol: 'https:', host: 'proxy.example:3080' }, 'web 1', 'root', 80, 24)).toBe('wss://proxy.example:3080/webapi/terminal?node=web+1&login=root&cols=80&rows=24');
    expect(subprotocols('abc_DEF-123')).toEqual(['gateway-terminal', 'bearer.abc_DEF-123']);
    expect(JSON.parse(resizeMessage(120.7, 40))).toEqual({ type: 'resize', cols: 120, rows: 40 });
  });

  it('hostile: sizes are clamped, a bearer that is not a token is never put in the handshake', () => {
    expect(clampSize(1e9, -5)).toEqual({ cols: 1000, rows: 1 });
    expect(clampSize(Number.NaN, Number.POSITIVE_INFINITY)).toEqual({ cols: 80, rows: 24 });
    expect(() => subprotocols('abc\r\nX-Evil: 1')).toThrow(/base64url/);
    expect(() => subprotocols('')).toThrow(/base64url/);
  });

  it('server messages: error, exit; anything else, huge or not JSON is shown as text, never trusted', () => {
    expect(parseServerMessage('{"type":"error","code":"GW_ERR_ACCESS_DENIED","message":"no","hint":"h"}')).toEqual({ type: 'error', code: 'GW_ERR_ACCESS_DENIED', message: 'no', hint: 'h' });
    const exit = parseServerMessage('{"type":"exit","code":3}');
    expect(exit).toMatchObject({ type: 'exit', code: 3 });
    expect(exitLine(exit as Extract<typeof exit, { type: 'exit' }>)).toBe('[session exited with status 3]');
    expect(exitLine({ type: 'exit', code: undefined, signal: 'KILL', message: '' })).toBe('[session killed by signal KILL]');
    expect(parseServerMessage('not json').type).toBe('other');
    expect(parseServerMessage('null').type).toBe('other');
    expect(parseServerMessage('[1]').type).toBe('other');
    expect(parseServerMessage('{"type":"__proto__"}').type).toBe('other');
    expect(parseServerMessage(`{"type":"error","message":"${'x'.repeat(70_000)}"}`).type).toBe('other');
    expect((parseServerMessage(`{"type":"error","message":"${'x'.repeat(10_000)}"}`) as { message: string }).message.length).toBe(4096);
  });
});

describe('the bearer store', () => {
  const memory = (): KeyValueStore & { data: Map<string, string> } => {
    const data = new Map<string, string>();
    return { data, getItem: (k) => data.get(k) ?? null, setItem: (k, v) => void data.set(k, v), removeItem: (k) => void data.delete(k) };
  };

  it('keeps the bearer in memory and session storage, and forgets it on clear', () => {
    const store = memory();
    const b = new BearerStore(store);
    b.set('QmVhcmVyVG9rZW5CZWFyZXJUb2tlbg');
    expect(new BearerStore(store).get()).toBe('QmVhcmVyVG9rZW5CZWFyZXJUb2tlbg');
    b.clear();
    expect(store.data.size).toBe(0);
    expect(b.get()).toBeUndefined();
  });

  it('hostile: a value that is not base64url is refused from the server and ignored from storage; storage that throws is not fatal', () => {
    const store = memory();
    expect(() => new BearerStore(store).set('a b\r\n')).toThrow(/base64url/);
    store.data.set('gw_bearer', '<script>');
    expect(new BearerStore(store).get()).toBeUndefined();
    const broken: KeyValueStore = {
      getItem: () => {
        throw new Error('SecurityError');
      },
      setItem: () => {
        throw new Error('QuotaExceeded');
      },
      removeItem: () => {
        throw new Error('SecurityError');
      },
    };
    const b = new BearerStore(broken);
    b.set('QmVhcmVyVG9rZW5CZWFyZXJUb2tlbg');
    expect(b.get()).toBe('QmVhcmVyVG9rZW5CZWFyZXJUb2tlbg');
    b.clear();
  });
});

describe('audit rows', () => {
  it('names who did it: the caller, the user of a login, or the user on the agent that reported it', () => {
    expect(eventSummary({ name: '1', event: { event: 'token.create', time: 't', by: { kind: 'user', name: 'alice' }, token: 'abc', roles: ['node'] } })).toMatchObject({ name: 'token.create', by: 'alice', details: 'token=abc roles=node' });
    expect(eventSummary({ name: '2', event: { event: 'user.login', user: 'bob', method: 'web' } }).by).toBe('bob');
    expect(eventSummary({ name: '3', event: { event: 'session.start', user: 'bob', reported_by: { host_id: 'h', nodename: 'web-1' } } }).by).toBe('bob on web-1');
    expect(eventSummary({ name: '4', event: { event: 'x', by: { kind: 'host', name: 'h1' } } }).by).toBe('h1 (host)');
    expect(eventSummary({ name: '4', event: { event: 'x', by: { kind: 'admin', name: 'admin' } } }).by).toBe('admin');
  });

  it('sessions: the resource, the bytes and the duration in their own columns', () => {
    const db = eventSummary({ name: '9', event: { event: 'db.session.end', user: 'alice', resource: 'pg', protocol: 'postgres', db_user: 'orders', db_name: 'shop', client: '192.0.2.1:5000', bytes_in: 1234, bytes_out: 5_600_000, duration_ms: 65_000, reported_by: { proxy_id: 'p1' } } });
    expect(db).toMatchObject({ by: 'alice', resource: 'pg (postgres, orders@shop)', bytes: '1.2 kB / 5.6 MB', duration: '1m05s' });
    expect(db.details).toBe('user=alice client=192.0.2.1:5000');
    expect(eventSummary({ name: '10', event: { event: 'session.end', user: 'bob', login: 'root', node: 'web-1' } })).toMatchObject({ resource: 'root@web-1', bytes: '', duration: '' });
    expect(eventSummary({ name: '11', event: { event: 'app.session.end', user: 'mallory', coalesced: 940, resources: ['echo', 'wiki'], bytes_in: 940, bytes_out: 0 } })).toMatchObject({ resource: 'echo, wiki', bytes: '940 B / 0 B' });
    expect(eventSummary({ name: '12', event: { event: 'db.session.end', bytes_in: -1, duration_ms: 'x' } })).toMatchObject({ bytes: '', duration: '' });
  });

  it('hostile: deep or huge events are cut, a missing name does not throw', () => {
    let deep: Record<string, unknown> = { v: 1 };
    for (let i = 0; i < 1000; i++) deep = { d: deep };
    expect(eventSummary({ name: '5', event: { event: 'x', deep } }).details).toContain('…');
    expect(eventSummary({ name: '6', event: { event: 'x', big: 'y'.repeat(10_000) } }).details.length).toBeLessThanOrEqual(401);
    expect(eventSummary({ name: '7', event: {} }).name).toBe('(unnamed)');
    expect(eventSummary({ name: '8', event: null as unknown as Record<string, unknown> }).name).toBe('(unnamed)');
  });
});

describe('openableLink (hyperlinks printed in the terminal)', () => {
  it('opens http(s) only: a server printing javascript:, data: or file: links cannot make the page go there', () => {
    expect(openableLink('https://grafana.example.com/d/1')).toBe(true);
    expect(openableLink('HTTP://intranet/')).toBe(true);
    for (const bad of ['javascript:alert(1)', 'JaVaScRiPt:alert(1)', 'data:text/html,<script>1</script>', 'file:///etc/passwd', 'https://', ' https://x', 'vbscript:x', `https://${'a'.repeat(3000)}`]) {
      expect(openableLink(bad), bad).toBe(false);
    }
  });
});

describe('the app launch (route.ts)', () => {
  const STATE = 'N'.repeat(43);
  it("starts on the app's own host, naming the app and the page's own address", () => {
    expect(appLaunchStart('grafana.example.com', '', 'grafana', 'proxy.example.com')).toBe('https://grafana.example.com/x-gateway-auth?app=grafana&web=proxy.example.com');
    expect(appLaunchStart('grafana.example.com', '3080', 'grafana', 'proxy.example.com:3080')).toBe('https://grafana.example.com:3080/x-gateway-auth?app=grafana&web=proxy.example.com%3A3080');
    expect(matchRoute('/web/launch')).toEqual({ page: 'launch', params: {} });
  });

  it('takes the launch page query only when app, addr and state are well formed (hostile ones refused)', () => {
    expect(launchParams(`?app=grafana&addr=Grafana.example.com:3080&state=${STATE}`)).toEqual({ app: 'grafana', addr: 'grafana.example.com:3080', state: STATE });
    for (const bad of [`?app=grafana&addr=g.example.com`, `?app=grafana&state=${STATE}`, `?addr=g.example.com&state=${STATE}`, `?app=../x&addr=g.example.com&state=${STATE}`, `?app=g&addr=evil.example/x&state=${STATE}`, `?app=g&addr=a@evil.example&state=${STATE}`, '?app=g&addr=g.example.com&state=short']) {
      expect(launchParams(bad), bad).toBeUndefined();
    }
  });

  it("goes on only to the launch's own host, over https, to /x-gateway-auth", () => {
    expect(launchUrlFits(`https://grafana.example.com:3080/x-gateway-auth?token=t&state=${STATE}`, 'grafana.example.com:3080')).toBe(true);
    expect(launchUrlFits('https://grafana.example.com/x-gateway-auth?token=t', 'grafana.example.com:443')).toBe(true);
    for (const bad of ['http://grafana.example.com:3080/x-gateway-auth', 'https://evil.example:3080/x-gateway-auth', 'https://grafana.example.com:3080/other', 'javascript:alert(1)', 'not a url']) {
      expect(launchUrlFits(bad, 'grafana.example.com:3080'), bad).toBe(false);
    }
  });
});

describe("a join token's command line", () => {
  const token = { token: 'abc123', id: 'id1', expiresAt: '2026-01-01T00:00:00Z', roles: ['node', 'db'], ca_pin: 'sha256:ff' };
  it("is gwctl tokens add's, with the Proxy's public address from ping (not the browser's host)", () => {
    expect(joinCommand(token, 'gateway.example.com:443')).toBe(
      'gateway start -c /etc/gateway.yaml --data-dir=/var/lib/gateway-agent --roles=node,db --token=abc123 --ca-pin=sha256:ff --proxy=gateway.example.com:443',
    );
  });
  it("falls back to the CLI's placeholder when ping did not say (never an empty --proxy=)", () => {
    expect(joinCommand(token, undefined)).toMatch(/ --proxy=<proxy-host>:443$/);
    expect(joinCommand(token, '')).toMatch(/ --proxy=<proxy-host>:443$/);
  });
  it("a Proxy's token joins at the Auth API with its roles, as the CLI prints it", () => {
    expect(joinCommand({ ...token, roles: ['proxy'] }, 'x:443')).toBe('gateway start --data-dir=/var/lib/gateway-proxy --roles=proxy --auth-server=<auth-host>:3025 --token=abc123 --ca-pin=sha256:ff');
  });
});

describe("the maintenance role's steps", () => {
  it("are the README's lines for its first admin (access,editor): the page and the README say the same", () => {
    const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
    const block = codeBlocks(readme, 'Start here').find((b) => b.body.includes('maintenance-admin'));
    expect(block?.body).toBe(maintenanceRoleSteps('alice', ['access', 'editor']));
  });
  it('keep the roles the user has, add the role once, and quote what a shell would read otherwise', () => {
    expect(maintenanceRoleSteps('bob', ['maintenance-admin', 'access'])).toContain('gwctl users update bob --set-roles=maintenance-admin,access\n');
    const hostile = maintenanceRoleSteps("x';rm -rf ~;'", ['a$(id)']);
    expect(hostile).toContain(`gwctl users update 'x'\\'';rm -rf ~;'\\''' --set-roles='a$(id),maintenance-admin'`);
  });
});
