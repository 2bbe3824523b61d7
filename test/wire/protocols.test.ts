/**
 * The wire's protocol table (src/wire/protocols.ts) is the one declaration of each protocol: these tests check the
 * table is consistent, and that what is derived from it follows every row, so that a row added there (a new
 * database protocol) gets its configuration keys, their errors, its banner line and its place in ping and the
 * client without a second list to edit. The Proxy's side (routes, listeners, access) is test/proxy/protocols.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { startBanner } from '../../src/cli/banner.js';
import { defaultConfig, parseConfig } from '../../src/config/index.js';
import type { Daemon } from '../../src/daemon.js';
import { GatewayError } from '../../src/errors.js';
import { pingProxy } from '../../src/proxy/ping.js';
import { DATABASE_PROTOCOLS, databaseRoute, listenerRows, WIRE_PROTOCOLS, WIRE_ROWS, wireRowOfAlpn } from '../../src/wire/protocols.js';

const failure = (text: string): GatewayError => {
  try {
    parseConfig(text, 'wire.yaml');
  } catch (err) {
    if (err instanceof GatewayError) return err;
    throw err;
  }
  throw new Error(`parseConfig accepted:\n${text}`);
};

const dbRows = WIRE_ROWS.filter((row) => row.database !== undefined);

describe('the table', () => {
  it('names, ALPN names, listener names, keys and ports are each used once', () => {
    const once = (values: unknown[]) => expect(new Set(values).size).toBe(values.length);
    once(WIRE_ROWS.map((row) => row.name));
    once(WIRE_ROWS.flatMap((row) => ('alpn' in row.on ? row.on.alpn : [])));
    once(listenerRows().map((row) => row.listener.name));
    once([...listenerRows().map((row) => row.listener.key), ...WIRE_ROWS.flatMap((row) => (row.publicAddr ? [row.publicAddr.key] : []))]);
    once(listenerRows().map((row) => row.listener.port));
  });

  it('every database row has its route, a TLS listener, a public address and a ping field', () => {
    expect(dbRows.map((row) => row.database)).toEqual([...DATABASE_PROTOCOLS]);
    expect(DATABASE_PROTOCOLS).toContain('redis');
    for (const row of dbRows) {
      const protocol = row.database as (typeof DATABASE_PROTOCOLS)[number];
      expect(row.name).toBe(databaseRoute(protocol));
      expect(row.on).toEqual({ alpn: [row.name] });
      expect(row.ping).toBe(true);
      expect(row.listener).toMatchObject({ key: `${row.listener!.name}_listen_addr`, accepts: 'tls' });
      expect(row.publicAddr?.key).toBe(`${row.listener!.name}_public_addr`);
      expect(row.pingDb?.public).toBe(row.publicAddr?.key);
      expect(wireRowOfAlpn(`${row.name}-ping`)).toBe(row);
    }
  });
});

describe('the configuration follows every row', () => {
  const defaults = defaultConfig().proxy_service as unknown as Record<string, unknown>;

  it.each(listenerRows().map((row) => [row.listener.key, row] as const))('%s: its default, its port for a host alone, its errors', (key, row) => {
    const l = row.listener;
    if (l.off) expect(defaults[key]).toBeUndefined();
    else if (row.name !== 'web') expect(defaults[key]).toEqual({ host: '0.0.0.0', port: l.port });
    const parsed = parseConfig(`proxy_service:\n  ${key}: gw.example.com\n`, 'wire.yaml').proxy_service as unknown as Record<string, unknown>;
    expect(parsed[key]).toEqual({ host: 'gw.example.com', port: l.port });
    // The same error as every listen address: the code, the key's path and position, a hint on how to write it.
    const err = failure(`proxy_service:\n  ${key}: "foo:bar"\n`);
    expect({ code: err.code, path: err.details.path, line: err.details.line }).toEqual({ code: 'GW_ERR_CONFIG_ADDR', path: `proxy_service.${key}`, line: 2 });
    expect(err.hint).toBe(failure('proxy_service:\n  web_listen_addr: "foo:bar"\n').hint);
  });

  it.each(WIRE_ROWS.flatMap((row) => (row.publicAddr ? [[row.publicAddr.key, row] as const] : [])))('%s: empty by default, the listener’s port for a host alone, its errors', (key, row) => {
    expect(defaults[key]).toEqual([]);
    const parsed = parseConfig(`proxy_service:\n  ${key}: [gw.example.com, "10.0.0.1:9000"]\n`, 'wire.yaml').proxy_service as unknown as Record<string, unknown>;
    expect(parsed[key]).toEqual([
      { host: 'gw.example.com', port: row.listener!.port },
      { host: '10.0.0.1', port: 9000 },
    ]);
    const err = failure(`proxy_service:\n  ${key}: "bad host!"\n`);
    expect({ code: err.code, path: err.details.path }).toEqual({ code: 'GW_ERR_CONFIG_ADDR', path: `proxy_service.${key}` });
    expect(err.hint).toBe(failure('proxy_service:\n  ssh_public_addr: "bad host!"\n').hint);
  });

  it('a database of every protocol of the table is accepted, and no other protocol', () => {
    for (const protocol of DATABASE_PROTOCOLS) {
      const c = parseConfig(`db_service:\n  databases:\n    - { name: d, protocol: ${protocol}, uri: "db:1" }\n`, 'wire.yaml');
      expect(c.db_service.databases[0]!.protocol).toBe(protocol);
    }
    expect(failure('db_service:\n  databases:\n    - { name: d, protocol: oracle, uri: "db:1" }\n').details.path).toBe('db_service.databases[0].protocol');
  });
});

describe('ping and the banner follow every row', () => {
  it("ping's db section has every database row's fields: its public address, or the web's with TLS routing", () => {
    const separate = parseConfig(
      `gateway:\n  nodename: gw.example.com\nauth_service:\n  proxy_listener_mode: separate\nproxy_service:\n  redis_public_addr: cache.example.com\n`,
      'wire.yaml',
    );
    const db = pingProxy(separate).db as Record<string, string>;
    for (const row of WIRE_PROTOCOLS) {
      if (!('pingDb' in row)) continue;
      expect(db[row.pingDb.public]).toBe(row.name === 'gateway-redis' ? 'cache.example.com:6379' : `gw.example.com:${row.listener.port}`);
    }
    const multiplex = pingProxy(parseConfig('gateway:\n  nodename: gw.example.com\nproxy_service:\n  web_listen_addr: ":3080"\n', 'wire.yaml')).db;
    expect(new Set(Object.entries(multiplex).filter(([k]) => k.endsWith('_public_addr')).map(([, v]) => v))).toEqual(new Set(['gw.example.com:3080']));
    expect(Object.keys(multiplex).sort()).toEqual(Object.keys(db).sort());
  });

  it('the one port with tunnel_public_addr set advertises the tunnel listener beside it (the ladder\'s lower rung); without it, the web address', () => {
    const yaml = (extra: string) => `gateway:\n  nodename: gw.example.com\nproxy_service:\n  web_listen_addr: ":3080"\n  tunnel_listen_addr: "0.0.0.0:3024"\n${extra}`;
    const beside = pingProxy(parseConfig(yaml('  tunnel_public_addr: tunnel.example.com\n'), 'wire.yaml'), { tunnel: '0.0.0.0:40024' });
    expect(beside.tls_routing_enabled).toBe(true);
    expect(beside.ssh.ssh_tunnel_public_addr).toBe('tunnel.example.com:3024');
    expect(beside.ssh.tunnel_listen_addr).toBe('0.0.0.0:40024');
    const alone = pingProxy(parseConfig(yaml(''), 'wire.yaml'));
    expect(alone.ssh.ssh_tunnel_public_addr).toBe('gw.example.com:3080');
  });

  it("the start banner names every listener of the table by its label (proxy_<name>)", () => {
    const config = defaultConfig();
    const addresses = Object.fromEntries(listenerRows().map(({ listener: l }, i) => [l.name === 'web' ? 'web' : `proxy_${l.name}`, `127.0.0.1:${5000 + i}`]));
    const banner = startBanner(config, { services: ['proxy'], addresses } as unknown as Daemon);
    for (const [i, { listener: l }] of listenerRows().entries()) {
      const line = banner.split('\n').find((text) => text.endsWith(` 127.0.0.1:${5000 + i}`));
      if (l.name !== 'web') expect(line?.trim().startsWith(l.label)).toBe(true);
    }
  });
});
