import { mkdtempSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  defaultConfig,
  enabledServices,
  loadConfigFile,
  parseConfig,
  SERVICE_NAMES,
  type GatewayConfig,
} from '../../src/config/index.js';
import { defaultMaxConnections, defaultMaxConnectionsPerSource, readOpenFileLimit } from '../../src/net/source.js';
import { defaultDataDir, defaultWebPort } from '../../src/paths.js';

const parse = (text: string): GatewayConfig => parseConfig(text, 'config.yaml');

describe('defaults', () => {
  it('run auth and proxy, no agents', () => {
    const c = defaultConfig();
    expect(enabledServices(c)).toEqual(['auth_service', 'proxy_service']);
  });

  // The data directory and web port depend on who runs the gateway (test/paths.test.ts); the rest does not.
  it('fill every field', () => {
    const c = defaultConfig();
    expect(c.gateway).toEqual({
      nodename: hostname(),
      data_dir: defaultDataDir(),
      auth_server: [],
      upgrade_stale_after: 24 * 3_600_000,
      drain_limit: 30 * 60_000,
      e2e_pool: 2,
      drain_on_stop: false,
      storage: { type: 'sqlite', conn_string: undefined, ca_file: undefined, cert_file: undefined, key_file: undefined },
      tracing: { otlp_endpoint: undefined, sample_ratio: undefined, headers: undefined },
      log: { output: 'stderr', severity: 'info', format: undefined },
      limits: {
        tls_handshake_timeout: 10_000,
        header_timeout: 20_000,
        request_timeout: 120_000,
        idle_timeout: 300_000,
        ssh_handshake_timeout: 30_000,
        half_close_linger: 30_000,
        max_connections: defaultMaxConnections(readOpenFileLimit()),
        max_connections_per_source: defaultMaxConnectionsPerSource(defaultMaxConnections(readOpenFileLimit())),
      },
    });
    expect(c.auth_service).toEqual({
      enabled: true,
      autoupdate_interval: 15_000,
      public_addr: [],
      cluster_name: hostname(),
      listen_addr: { host: '0.0.0.0', port: 3025 },
      proxy_listener_mode: 'multiplex',
      keep_alive_interval: 15_000,
      keep_alive_count_max: 3,
      tunnel_strategy: { type: 'agent_mesh', agent_connection_count: 1 },
      authentication: { type: 'local', connector_name: '' },
    });
    const p = c.proxy_service;
    const ports = Object.fromEntries(
      Object.entries(p)
        .filter(([k]) => k.endsWith('_listen_addr') || k === 'listen_addr')
        .map(([k, v]) => [k, (v as { port: number } | undefined)?.port]),
    );
    expect(ports).toEqual({
      web_listen_addr: defaultWebPort(),
      tunnel_listen_addr: 3024,
      listen_addr: 3023,
      peer_listen_addr: 3021,
      mysql_listen_addr: 3036,
      postgres_listen_addr: 5432,
      mongo_listen_addr: 27017,
      redis_listen_addr: 6379,
      kube_listen_addr: undefined,
    });
    expect(p.automatic_upgrades_channels).toEqual({});
    expect(c.ssh_service.listen_addr).toEqual({ host: '0.0.0.0', port: 3022 });
    expect(c.kube_service.listen_addr).toEqual({ host: '0.0.0.0', port: 3026 });
    expect(c.windows_desktop_service.listen_addr).toEqual({ host: '0.0.0.0', port: 3028 });
    for (const name of SERVICE_NAMES) expect(c[name].public_addr).toEqual([]);
  });

  it.each([
    ['empty', ''],
    ['blank lines', '\n\n   \n'],
    ['only comments', '# nothing here\n# yet\n'],
    ['document marker', '---\n'],
    ['explicit null', '~\n'],
    ['empty mapping', '{}\n'],
  ])('an %s file gives the defaults', (_what, text) => {
    expect(parse(text)).toEqual(defaultConfig());
  });

  it('cluster_name follows nodename', () => {
    const c = parse('gateway:\n  nodename: node-1\n');
    expect(c.auth_service.cluster_name).toBe('node-1');
    expect(parse('gateway:\n  nodename: node-1\nauth_service:\n  cluster_name: example.com\n').auth_service.cluster_name).toBe(
      'example.com',
    );
  });

  it('are deeply frozen', () => {
    const c = parse('proxy_service:\n  public_addr: [a.example.com]\n  automatic_upgrades_channels:\n    x: {static_version: v1.0.0}\n');
    expect(Object.isFrozen(c)).toBe(true);
    expect(Object.isFrozen(c.gateway.log)).toBe(true);
    expect(Object.isFrozen(c.proxy_service.public_addr)).toBe(true);
    expect(Object.isFrozen(c.proxy_service.public_addr[0])).toBe(true);
    expect(Object.isFrozen(c.proxy_service.automatic_upgrades_channels['x'])).toBe(true);
    expect(Object.isFrozen(defaultConfig().auth_service.listen_addr)).toBe(true);
  });
});

describe('which services run', () => {
  const runs = (text: string): string[] => enabledServices(parse(text));

  it.each<[string, string, string[]]>([
    ['no service section: auth + proxy', 'gateway:\n  nodename: n\n', ['auth_service', 'proxy_service']],
    ['a present section runs, absent ones do not', 'ssh_service: {}\n', ['ssh_service']],
    ['an empty section is present', 'ssh_service:\n', ['ssh_service']],
    ['proxy only', 'proxy_service:\n  web_listen_addr: ":3080"\n', ['proxy_service']],
    ['enabled: no turns a present section off', 'auth_service:\n  enabled: no\nproxy_service: {}\n', ['proxy_service']],
    ['all sections off: nothing runs', 'auth_service:\n  enabled: false\n', []],
    ['quoted "yes"', 'proxy_service:\n  enabled: "yes"\n', ['proxy_service']],
    ['quoted "no"', 'proxy_service:\n  enabled: "no"\nssh_service: {}\n', ['ssh_service']],
    ['boolean true', 'db_service:\n  enabled: true\n', ['db_service']],
    ['YAML 1.1 words in any case', 'app_service:\n  enabled: Yes\nkube_service:\n  enabled: OFF\nssh_service:\n  enabled: on\n', ['ssh_service', 'app_service']],
    ['enabled: with no value keeps the default (present → runs)', 'windows_desktop_service:\n  enabled:\n', ['windows_desktop_service']],
  ])('%s', (_what, text, expected) => {
    expect(runs(text)).toEqual(expected);
  });
});

describe('listen addresses', () => {
  const listen = (value: string) => parse(`auth_service:\n  listen_addr: ${JSON.stringify(value)}\n`).auth_service.listen_addr;

  it.each([
    ['10.0.0.5:4025', { host: '10.0.0.5', port: 4025 }],
    [':4025', { host: '0.0.0.0', port: 4025 }],
    ['[::1]:4025', { host: '::1', port: 4025 }],
    ['[::]:4025', { host: '::', port: 4025 }],
    ['::1', { host: '::1', port: 3025 }],
    ['auth.example.com', { host: 'auth.example.com', port: 3025 }],
    ['Auth.Example.COM.:1', { host: 'auth.example.com', port: 1 }],
    ['127.0.0.1', { host: '127.0.0.1', port: 3025 }],
    ['127.0.0.1:0', { host: '127.0.0.1', port: 0 }],
    [':0', { host: '0.0.0.0', port: 0 }],
  ])('%s', (text, expected) => {
    expect(listen(text)).toEqual(expected);
  });

  it('unquoted forms read the same', () => {
    const c = parse('proxy_service:\n  web_listen_addr: :3080\n  tunnel_listen_addr: 0.0.0.0:0\n  kube_listen_addr: kube.example.com\n');
    expect(c.proxy_service.web_listen_addr).toEqual({ host: '0.0.0.0', port: 3080 });
    expect(c.proxy_service.tunnel_listen_addr).toEqual({ host: '0.0.0.0', port: 0 });
    expect(c.proxy_service.kube_listen_addr).toEqual({ host: 'kube.example.com', port: 3026 });
  });
});

describe('public addresses', () => {
  it('a string becomes a list of one', () => {
    expect(parse('proxy_service:\n  public_addr: proxy.example.com\n').proxy_service.public_addr).toEqual([
      { host: 'proxy.example.com', port: 443 },
    ]);
  });

  it('a list keeps its order, each entry with its own port or the default', () => {
    const c = parse('proxy_service:\n  public_addr:\n    - proxy.example.com:3080\n    - 203.0.113.7\n    - "[2001:db8::1]:8443"\n    - 2001:db8::2\n');
    expect(c.proxy_service.public_addr).toEqual([
      { host: 'proxy.example.com', port: 3080 },
      { host: '203.0.113.7', port: 443 },
      { host: '2001:db8::1', port: 8443 },
      { host: '2001:db8::2', port: 443 },
    ]);
  });

  it('a flow list of IPv6 literals works unquoted', () => {
    expect(parse('ssh_service:\n  public_addr: [::1, "[::2]:22"]\n').ssh_service.public_addr).toEqual([
      { host: '::1', port: 3022 },
      { host: '::2', port: 22 },
    ]);
  });

  it('each per-protocol variant has its own default port', () => {
    const fields = ['ssh', 'tunnel', 'kube', 'postgres', 'mysql', 'mongo'].map((p) => `${p}_public_addr`);
    const c = parse(`proxy_service:\n${fields.map((f) => `  ${f}: p.example.com\n`).join('')}`);
    const ports = fields.map((f) => (c.proxy_service as unknown as Record<string, Array<{ port: number }>>)[f]![0]!.port);
    expect(ports).toEqual([3023, 3024, 3026, 5432, 3036, 27017]);
  });

  it('services with a listener default to its port', () => {
    const c = parse('auth_service:\n  public_addr: a\nssh_service:\n  public_addr: s\nkube_service:\n  public_addr: k\nwindows_desktop_service:\n  public_addr: w\n');
    expect([c.auth_service, c.ssh_service, c.kube_service, c.windows_desktop_service].map((s) => s.public_addr[0]!.port)).toEqual([
      3025, 3022, 3026, 3028,
    ]);
  });

  it('database and application services keep a missing port undefined', () => {
    const c = parse('db_service:\n  public_addr: [db.example.com, "db2.example.com:5433"]\napp_service:\n  public_addr: apps.example.com\n');
    expect(c.db_service.public_addr).toEqual([
      { host: 'db.example.com', port: undefined },
      { host: 'db2.example.com', port: 5433 },
    ]);
    expect(c.app_service.public_addr).toEqual([{ host: 'apps.example.com', port: undefined }]);
  });

  it('an empty list or no value means none', () => {
    expect(parse('proxy_service:\n  public_addr: []\n').proxy_service.public_addr).toEqual([]);
    expect(parse('proxy_service:\n  public_addr:\n').proxy_service.public_addr).toEqual([]);
  });
});

describe('automatic upgrade channels', () => {
  const channels = (body: string) => parse(`proxy_service:\n  automatic_upgrades_channels:\n${body}`).proxy_service.automatic_upgrades_channels;

  it('static_version and forward_url channels, names with /', () => {
    expect(
      channels(
        '    default:\n      static_version: v17.0.1\n' +
          '    stable/v14:\n      static_version: v14.3.7-rc.1\n' +
          '    stable/rolling:\n      forward_url: https://updates.example.com/v1/channel/stable/rolling\n' +
          '    edge.test_1-x:\n      forward_url: http://10.0.0.9:8080\n',
      ),
    ).toEqual({
      default: { static_version: 'v17.0.1', forward_url: undefined },
      'stable/v14': { static_version: 'v14.3.7-rc.1', forward_url: undefined },
      'stable/rolling': { static_version: undefined, forward_url: 'https://updates.example.com/v1/channel/stable/rolling' },
      'edge.test_1-x': { static_version: undefined, forward_url: 'http://10.0.0.9:8080' },
    });
  });

  it('a channel named __proto__ is an ordinary key', () => {
    const c = channels('    __proto__:\n      static_version: v1.2.3\n');
    expect(Object.keys(c)).toEqual(['__proto__']);
    expect(Object.getPrototypeOf(c)).toBe(Object.prototype);
  });

  it('an empty map or no value means no channels of its own', () => {
    expect(parse('proxy_service:\n  automatic_upgrades_channels: {}\n').proxy_service.automatic_upgrades_channels).toEqual({});
    expect(parse('proxy_service:\n  automatic_upgrades_channels:\n').proxy_service.automatic_upgrades_channels).toEqual({});
  });
});

describe('other fields', () => {
  it('log settings, enums in any case', () => {
    const c = parse('gateway:\n  log:\n    output: /var/log/gateway.log\n    severity: DEBUG\n    format: Text\n');
    expect(c.gateway.log).toEqual({ output: '/var/log/gateway.log', severity: 'debug', format: 'text' });
    expect(parse('gateway:\n  log:\n    output: STDOUT\n').gateway.log.output).toBe('stdout');
  });

  it('ssh_service.sftp_server: unset (the built-in server) by default, or a program', () => {
    expect(defaultConfig().ssh_service.sftp_server).toBeUndefined();
    expect(parse('ssh_service:\n  sftp_server: /usr/lib/openssh/sftp-server\n').ssh_service.sftp_server).toBe('/usr/lib/openssh/sftp-server');
  });

  it('separate listener mode', () => {
    expect(parse('auth_service:\n  proxy_listener_mode: separate\n').auth_service.proxy_listener_mode).toBe('separate');
  });

  it('anchors and aliases resolve', () => {
    const c = parse('proxy_service:\n  public_addr: &pub proxy.example.com\n  ssh_public_addr: *pub\n');
    expect(c.proxy_service.ssh_public_addr).toEqual([{ host: 'proxy.example.com', port: 3023 }]);
  });

  it('flow style, comments and a byte-order mark are fine', () => {
    const c = parse('\ufeff# gateway\n{gateway: {nodename: n1}, ssh_service: {enabled: yes}} # trailing\n');
    expect(c.gateway.nodename).toBe('n1');
    expect(enabledServices(c)).toEqual(['ssh_service']);
  });
});

describe('loadConfigFile', () => {
  it('reads and parses a file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'gateway-config-'));
    const path = join(dir, 'gateway.yaml');
    writeFileSync(path, 'gateway:\n  nodename: from-file\n');
    const c = loadConfigFile(path);
    expect(c.gateway.nodename).toBe('from-file');
    expect(enabledServices(c)).toEqual(['auth_service', 'proxy_service']);
  });
});

describe('gateway.limits caps', () => {
  it('default to what the open-file limit can hold, and take written values as written', () => {
    expect(defaultMaxConnections(undefined)).toBe(10_000);
    expect(defaultMaxConnections(524_288)).toBe(10_000);
    expect(defaultMaxConnections(1_024)).toBe(224);
    expect(defaultMaxConnections(256)).toBe(32);
    expect(defaultMaxConnectionsPerSource(10_000)).toBe(1_000);
    expect(defaultMaxConnectionsPerSource(224)).toBe(56);
    expect(defaultMaxConnectionsPerSource(2)).toBe(1);
    const c = parse('gateway:\n  limits:\n    max_connections: 50000\n');
    expect(c.gateway.limits.max_connections).toBe(50_000);
    expect(c.gateway.limits.max_connections_per_source).toBe(1_000);
    expect(parse('gateway:\n  limits:\n    max_connections: 40\n').gateway.limits.max_connections_per_source).toBe(10);
  });
});

describe('proxy_service.proxy_protocol_trusted_sources', () => {
  it('is empty by default, and keeps each entry as written (trimmed), in order', () => {
    expect(parse('proxy_service:\n  proxy_protocol: on\n').proxy_service.proxy_protocol_trusted_sources).toEqual([]);
    const c = parse('proxy_service:\n  proxy_protocol: on\n  proxy_protocol_trusted_sources:\n    - " 10.0.0.0/8"\n    - 192.0.2.7\n    - "2001:db8::/32"\n    - "::ffff:198.51.100.0/120"\n');
    expect(c.proxy_service.proxy_protocol_trusted_sources).toEqual(['10.0.0.0/8', '192.0.2.7', '2001:db8::/32', '::ffff:198.51.100.0/120']);
  });

  it('holds at most 256 entries', () => {
    const many = Array.from({ length: 257 }, (_, i) => `10.0.${i >> 8}.${i & 255}`).join(', ');
    expect(() => parse(`proxy_service:\n  proxy_protocol_trusted_sources: [${many}]\n`)).toThrow(/at most 256/);
  });
});
