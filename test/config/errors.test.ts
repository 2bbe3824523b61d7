import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfigFile, parseConfig } from '../../src/config/index.js';
import { GatewayError, type ErrorCode } from '../../src/errors.js';

/** The GatewayError parseConfig throws for text (fails the test when it does not throw one). */
function failure(text: string, source = 'config.yaml'): GatewayError {
  try {
    parseConfig(text, source);
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  throw new Error(`parseConfig accepted:\n${text}`);
}

/** [what, YAML text, code, key path, line, column] — the position of the offending key or value. */
type Case = [string, string, ErrorCode, string, number, number];

const cases: Case[] = [
  // --- YAML syntax -------------------------------------------------------------------------------------------
  ['unclosed flow sequence', 'gateway:\n  nodename: [a\n', 'GW_ERR_CONFIG_SYNTAX', '', 3, 1],
  ['tab as indentation', 'gateway:\n\tnodename: a\n', 'GW_ERR_CONFIG_SYNTAX', '', 2, 1],
  ['unquoted [v6]:port', 'auth_service:\n  listen_addr: [::1]:3025\n', 'GW_ERR_CONFIG_SYNTAX', '', 2, 21],
  ['two documents', 'gateway: {}\n---\nauth_service: {}\n', 'GW_ERR_CONFIG_SYNTAX', '', 2, 1],
  ['alias to no anchor', 'auth_service:\n  listen_addr: *nowhere\n', 'GW_ERR_CONFIG_SYNTAX', 'auth_service.listen_addr', 2, 16],

  // --- document shape ------------------------------------------------------------------------------------------
  ['document is a list', '- gateway\n- auth_service\n', 'GW_ERR_CONFIG_TYPE', '', 1, 1],
  ['document is a string', 'just some words\n', 'GW_ERR_CONFIG_TYPE', '', 1, 1],
  ['document is a number', '\n\n42\n', 'GW_ERR_CONFIG_TYPE', '', 3, 1],

  // --- unknown keys --------------------------------------------------------------------------------------------
  ['unknown top-level key', 'gateway: {}\nproxy:\n  enabled: yes\n', 'GW_ERR_CONFIG_UNKNOWN_KEY', 'proxy', 2, 1],
  ['typo in a proxy key', 'proxy_service:\n  web_listen_adr: ":443"\n', 'GW_ERR_CONFIG_UNKNOWN_KEY', 'proxy_service.web_listen_adr', 2, 3],
  ['unknown key under log', 'gateway:\n  log:\n    level: info\n', 'GW_ERR_CONFIG_UNKNOWN_KEY', 'gateway.log.level', 3, 5],
  [
    'unknown key in a channel',
    'proxy_service:\n  automatic_upgrades_channels:\n    stable/v14:\n      static_version: v14.0.0\n      critical: yes\n',
    'GW_ERR_CONFIG_UNKNOWN_KEY',
    'proxy_service.automatic_upgrades_channels.stable/v14.critical',
    5,
    7,
  ],
  ['key of another section', 'proxy_service:\n  cluster_name: x\n', 'GW_ERR_CONFIG_UNKNOWN_KEY', 'proxy_service.cluster_name', 2, 3],

  // --- duplicate keys ----------------------------------------------------------------------------------------
  ['duplicate section', 'auth_service: {}\nproxy_service: {}\nauth_service: {}\n', 'GW_ERR_CONFIG_DUPLICATE_KEY', 'auth_service', 3, 1],
  ['duplicate leaf', 'gateway:\n  nodename: a\n  data_dir: /d\n  nodename: b\n', 'GW_ERR_CONFIG_DUPLICATE_KEY', 'gateway.nodename', 4, 3],
  [
    'duplicate channel',
    'proxy_service:\n  automatic_upgrades_channels:\n    a: {static_version: v1.0.0}\n    a: {static_version: v2.0.0}\n',
    'GW_ERR_CONFIG_DUPLICATE_KEY',
    'proxy_service.automatic_upgrades_channels.a',
    4,
    5,
  ],

  // --- wrong types ---------------------------------------------------------------------------------------------
  ['section is a string', 'gateway: hello\n', 'GW_ERR_CONFIG_TYPE', 'gateway', 1, 10],
  ['section is a list', 'proxy_service:\n  - enabled\n', 'GW_ERR_CONFIG_TYPE', 'proxy_service', 2, 3],
  ['string field is a list', 'gateway:\n  nodename: [a, b]\n', 'GW_ERR_CONFIG_TYPE', 'gateway.nodename', 2, 13],
  ['string field is a number', 'auth_service:\n  cluster_name: 42\n', 'GW_ERR_CONFIG_TYPE', 'auth_service.cluster_name', 2, 17],
  ['listen addr is a number', 'ssh_service:\n  listen_addr: 3022\n', 'GW_ERR_CONFIG_TYPE', 'ssh_service.listen_addr', 2, 16],
  ['listen addr is a list', 'auth_service:\n  listen_addr: [":3025"]\n', 'GW_ERR_CONFIG_TYPE', 'auth_service.listen_addr', 2, 16],
  ['enabled is a number', 'ssh_service:\n  enabled: 1\n', 'GW_ERR_CONFIG_TYPE', 'ssh_service.enabled', 2, 12],
  ['public_addr is a mapping', 'proxy_service:\n  public_addr: {host: a}\n', 'GW_ERR_CONFIG_TYPE', 'proxy_service.public_addr', 2, 16],
  [
    'public_addr item is a list',
    'proxy_service:\n  public_addr:\n    - a.example.com\n    - [b.example.com]\n',
    'GW_ERR_CONFIG_TYPE',
    'proxy_service.public_addr[1]',
    4,
    7,
  ],
  ['public_addr item is empty', 'proxy_service:\n  public_addr: [a.example.com, ~]\n', 'GW_ERR_CONFIG_TYPE', 'proxy_service.public_addr[1]', 2, 32],
  ['channels is a list', 'proxy_service:\n  automatic_upgrades_channels: [stable]\n', 'GW_ERR_CONFIG_TYPE', 'proxy_service.automatic_upgrades_channels', 2, 32],
  [
    'channel is a string',
    'proxy_service:\n  automatic_upgrades_channels:\n    stable: v14.0.0\n',
    'GW_ERR_CONFIG_TYPE',
    'proxy_service.automatic_upgrades_channels.stable',
    3,
    13,
  ],
  ['key is a list', 'gateway:\n  ? [a, b]\n  : c\n', 'GW_ERR_CONFIG_TYPE', 'gateway', 2, 5],
  ['key is missing', 'gateway:\n  : c\n', 'GW_ERR_CONFIG_TYPE', 'gateway', 2, 3],

  // --- bad values ----------------------------------------------------------------------------------------------
  ['tracing ratio over 1', 'gateway:\n  tracing:\n    sample_ratio: 1.5\n', 'GW_ERR_CONFIG_VALUE', 'gateway.tracing.sample_ratio', 3, 19],
  ['tracing ratio quoted', 'gateway:\n  tracing:\n    sample_ratio: "0.5"\n', 'GW_ERR_CONFIG_TYPE', 'gateway.tracing.sample_ratio', 3, 19],
  ['tracing endpoint not http', 'gateway:\n  tracing:\n    otlp_endpoint: grpc://c:4317\n', 'GW_ERR_CONFIG_VALUE', 'gateway.tracing.otlp_endpoint', 3, 20],
  ['tracing headers without =', 'gateway:\n  tracing:\n    headers: x-api-key\n', 'GW_ERR_CONFIG_VALUE', 'gateway.tracing.headers', 3, 14],
  ['bad severity', 'gateway:\n  log:\n    severity: loud\n', 'GW_ERR_CONFIG_VALUE', 'gateway.log.severity', 3, 15],
  ['bad log format', 'gateway:\n  log:\n    format: xml\n', 'GW_ERR_CONFIG_VALUE', 'gateway.log.format', 3, 13],
  ['relative log file', 'gateway:\n  log:\n    output: gateway.log\n', 'GW_ERR_CONFIG_VALUE', 'gateway.log.output', 3, 13],
  ['relative data_dir', 'gateway:\n  data_dir: var/lib/gateway\n', 'GW_ERR_CONFIG_VALUE', 'gateway.data_dir', 2, 13],
  ['relative sftp_server', 'ssh_service:\n  sftp_server: sftp-server\n', 'GW_ERR_CONFIG_VALUE', 'ssh_service.sftp_server', 2, 16],
  ['empty nodename', 'gateway:\n  nodename: ""\n', 'GW_ERR_CONFIG_VALUE', 'gateway.nodename', 2, 13],
  ['bad proxy_listener_mode', 'auth_service:\n  proxy_listener_mode: single\n', 'GW_ERR_CONFIG_VALUE', 'auth_service.proxy_listener_mode', 2, 24],
  ['enabled is neither yes nor no', 'ssh_service:\n  enabled: maybe\n', 'GW_ERR_CONFIG_VALUE', 'ssh_service.enabled', 2, 12],
  [
    'version without v',
    'proxy_service:\n  automatic_upgrades_channels:\n    stable/v14:\n      static_version: 14.3.7\n',
    'GW_ERR_CONFIG_VALUE',
    'proxy_service.automatic_upgrades_channels.stable/v14.static_version',
    4,
    23,
  ],
  [
    'version that is not semver',
    'proxy_service:\n  automatic_upgrades_channels:\n    stable/v14:\n      static_version: v14.3\n',
    'GW_ERR_CONFIG_VALUE',
    'proxy_service.automatic_upgrades_channels.stable/v14.static_version',
    4,
    23,
  ],
  [
    'version with two v',
    'proxy_service:\n  automatic_upgrades_channels:\n    x:\n      static_version: vv14.3.7\n',
    'GW_ERR_CONFIG_VALUE',
    'proxy_service.automatic_upgrades_channels.x.static_version',
    4,
    23,
  ],
  [
    'forward_url not http(s)',
    'proxy_service:\n  automatic_upgrades_channels:\n    x:\n      forward_url: ftp://updates.example.com/\n',
    'GW_ERR_CONFIG_VALUE',
    'proxy_service.automatic_upgrades_channels.x.forward_url',
    4,
    20,
  ],
  [
    'forward_url not a URL',
    'proxy_service:\n  automatic_upgrades_channels:\n    x:\n      forward_url: updates.example.com\n',
    'GW_ERR_CONFIG_VALUE',
    'proxy_service.automatic_upgrades_channels.x.forward_url',
    4,
    20,
  ],
  [
    'channel name with an empty part',
    'proxy_service:\n  automatic_upgrades_channels:\n    stable//v14: {static_version: v14.0.0}\n',
    'GW_ERR_CONFIG_VALUE',
    'proxy_service.automatic_upgrades_channels.stable//v14',
    3,
    5,
  ],
  [
    'channel name with ..',
    'proxy_service:\n  automatic_upgrades_channels:\n    stable/../x: {static_version: v14.0.0}\n',
    'GW_ERR_CONFIG_VALUE',
    'proxy_service.automatic_upgrades_channels.stable/../x',
    3,
    5,
  ],
  [
    'channel name with a space',
    'proxy_service:\n  automatic_upgrades_channels:\n    "my channel": {static_version: v14.0.0}\n',
    'GW_ERR_CONFIG_VALUE',
    'proxy_service.automatic_upgrades_channels.my channel',
    3,
    5,
  ],

  // --- addresses ---------------------------------------------------------------------------------------------
  ['listen port not a number', 'proxy_service:\n  web_listen_addr: "foo:bar"\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.web_listen_addr', 2, 20],
  ['listen port too large', 'auth_service:\n  listen_addr: ":65536"\n', 'GW_ERR_CONFIG_ADDR', 'auth_service.listen_addr', 2, 16],
  ['listen host not a name', 'auth_service:\n  listen_addr: "bad host:3025"\n', 'GW_ERR_CONFIG_ADDR', 'auth_service.listen_addr', 2, 16],
  ['unbracketed v6 with port', 'auth_service:\n  listen_addr: "::1:3025:x"\n', 'GW_ERR_CONFIG_ADDR', 'auth_service.listen_addr', 2, 16],
  ['empty listen addr', 'auth_service:\n  listen_addr: ""\n', 'GW_ERR_CONFIG_ADDR', 'auth_service.listen_addr', 2, 16],
  ['public_addr not a name', 'proxy_service:\n  public_addr: "gate way.example.com"\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  ['public_addr port 0', 'proxy_service:\n  public_addr: "proxy.example.com:0"\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  ['public_addr without host', 'proxy_service:\n  public_addr: ":443"\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  [
    'second public_addr unclosed bracket',
    'ssh_service:\n  public_addr:\n    - node.example.com\n    - "[2001:db8::1"\n',
    'GW_ERR_CONFIG_ADDR',
    'ssh_service.public_addr[1]',
    4,
    7,
  ],
  ['per-protocol public addr', 'proxy_service:\n  postgres_public_addr: "pg.example.com:x"\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.postgres_public_addr', 2, 25],
  // RFC 1123 host names and IPv4 literals only (src/addr.ts): each of these used to be accepted.
  ['public_addr octet 256', 'proxy_service:\n  public_addr: 10.0.0.256\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  ['public_addr 999.999.999.999:443', 'proxy_service:\n  public_addr: "999.999.999.999:443"\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  ['public_addr 1.2.3', 'proxy_service:\n  public_addr: [proxy.example.com, 1.2.3]\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr[1]', 2, 36],
  ['listen_addr 300.1.1.1', 'auth_service:\n  listen_addr: "300.1.1.1:3025"\n', 'GW_ERR_CONFIG_ADDR', 'auth_service.listen_addr', 2, 16],
  ['public_addr with "_"', 'ssh_service:\n  public_addr: foo_bar.example.com\n', 'GW_ERR_CONFIG_ADDR', 'ssh_service.public_addr', 2, 16],
  ['label over 63', `proxy_service:\n  public_addr: ${'x'.repeat(64)}.example.com\n`, 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  ['name over 253', `proxy_service:\n  public_addr: ${Array(5).fill('a'.repeat(60)).join('.')}\n`, 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  ['leading hyphen', 'proxy_service:\n  tunnel_public_addr: -proxy.example.com:3024\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.tunnel_public_addr', 2, 23],
  ['trailing hyphen', 'proxy_service:\n  public_addr: proxy-.example.com\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  ['empty label', 'proxy_service:\n  public_addr: proxy..example.com\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  ['port over 65535', 'proxy_service:\n  public_addr: proxy.example.com:70000\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 2, 16],
  [
    'database uri with a bad octet',
    'db_service:\n  databases:\n    - {name: pg, protocol: postgres, uri: "10.0.0.256:5432"}\n',
    'GW_ERR_CONFIG_ADDR',
    'db_service.databases[0].uri',
    3,
    43,
  ],
  [
    'desktop addr with "_"',
    'windows_desktop_service:\n  desktops:\n    - {name: w, addr: win_1.corp}\n',
    'GW_ERR_CONFIG_ADDR',
    'windows_desktop_service.desktops[0].addr',
    3,
    23,
  ],
  [
    'app uri host 1.2.3',
    'app_service:\n  apps:\n    - {name: a, uri: "http://1.2.3:8080"}\n',
    'GW_ERR_CONFIG_ADDR',
    'app_service.apps[0].uri',
    3,
    22,
  ],
  [
    'kube api_server with "_"',
    'kube_service:\n  clusters:\n    - {name: dev, api_server: "https://k8s_api.internal:6443"}\n',
    'GW_ERR_CONFIG_ADDR',
    'kube_service.clusters[0].api_server',
    3,
    31,
  ],
  [
    'forward_url host 300.1.1.1',
    'proxy_service:\n  automatic_upgrades_channels:\n    default: {forward_url: "https://300.1.1.1/v1/webapi/automaticupgrades/channel/default"}\n',
    'GW_ERR_CONFIG_ADDR',
    'proxy_service.automatic_upgrades_channels.default.forward_url',
    3,
    28,
  ],

  // --- channels: exactly one of static_version / forward_url ---------------------------------------------------------
  [
    'channel with both',
    'proxy_service:\n  automatic_upgrades_channels:\n    stable/v14:\n      static_version: v14.0.0\n      forward_url: https://u.example.com/\n',
    'GW_ERR_CONFIG_CHANNEL',
    'proxy_service.automatic_upgrades_channels.stable/v14',
    3,
    5,
  ],
  [
    'channel with neither (empty)',
    'proxy_service:\n  automatic_upgrades_channels:\n    stable/v14:\n',
    'GW_ERR_CONFIG_CHANNEL',
    'proxy_service.automatic_upgrades_channels.stable/v14',
    3,
    5,
  ],
  [
    'channel with neither ({})',
    'proxy_service:\n  automatic_upgrades_channels:\n    default: {}\n',
    'GW_ERR_CONFIG_CHANNEL',
    'proxy_service.automatic_upgrades_channels.default',
    3,
    5,
  ],
  [
    'channel with neither (null values)',
    'proxy_service:\n  automatic_upgrades_channels:\n    default:\n      static_version:\n      forward_url: ~\n',
    'GW_ERR_CONFIG_CHANNEL',
    'proxy_service.automatic_upgrades_channels.default',
    3,
    5,
  ],

  // --- proxy_protocol_trusted_sources: addresses and networks only (src/mux/trust.ts) ----------------------------
  ['trusted source: a name', 'proxy_service:\n  proxy_protocol_trusted_sources: [10.0.0.0/8, lb.example.com]\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.proxy_protocol_trusted_sources[1]', 2, 48],
  ['trusted source: host bits set', 'proxy_service:\n  proxy_protocol_trusted_sources:\n    - 192.0.2.0/24\n    - 10.1.2.3/8\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.proxy_protocol_trusted_sources[1]', 4, 7],
  ['trusted source: a port', 'proxy_service:\n  proxy_protocol_trusted_sources: ["10.0.0.5:443"]\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.proxy_protocol_trusted_sources[0]', 2, 36],
  ['trusted source: a prefix over 128', 'proxy_service:\n  proxy_protocol_trusted_sources: ["2001:db8::/129"]\n', 'GW_ERR_CONFIG_ADDR', 'proxy_service.proxy_protocol_trusted_sources[0]', 2, 36],
  ['trusted source: a number', 'proxy_service:\n  proxy_protocol_trusted_sources: [10]\n', 'GW_ERR_CONFIG_TYPE', 'proxy_service.proxy_protocol_trusted_sources[0]', 2, 36],
  ['trusted source: twice', 'proxy_service:\n  proxy_protocol_trusted_sources: [10.0.0.5, 10.0.0.5]\n', 'GW_ERR_CONFIG_VALUE', 'proxy_service.proxy_protocol_trusted_sources[1]', 2, 46],
  ['trusted sources: one, not a list', 'proxy_service:\n  proxy_protocol_trusted_sources: 10.0.0.5\n', 'GW_ERR_CONFIG_TYPE', 'proxy_service.proxy_protocol_trusted_sources', 2, 35],
];

describe('parseConfig errors', () => {
  it.each(cases)('%s', (_what, text, code, path, line, column) => {
    const err = failure(text);
    expect({ code: err.code, path: err.details.path, line: err.details.line, column: err.details.column }).toEqual({
      code,
      path,
      line,
      column,
    });
    expect(err.details.source).toBe('config.yaml');
    expect(err.message).toContain(`config.yaml:${line}:${column}:`);
    if (path !== '') expect(err.message).toContain(path);
    expect(err.hint.length).toBeGreaterThan(0);
  });

  it('an address error names the value and gives the fix for that mistake', () => {
    const underscore = failure('proxy_service:\n  public_addr: foo_bar.example.com\n');
    expect(underscore.message).toContain('foo_bar.example.com');
    expect(underscore.message).toContain('"_"');
    expect(underscore.hint).toContain('Replace "_" with "-"');
    const octet = failure('proxy_service:\n  public_addr: "999.999.999.999:443"\n');
    expect(octet.message).toContain('over 255');
    expect(octet.hint).toContain('four numbers from 0 to 255');
    expect(failure('auth_service:\n  listen_addr: ":65536"\n').hint).toContain('1 to 65535');
  });

  it('keeps the names that are valid: localhost, kube.<cluster>.local, IPv6 with a port, a trailing dot', () => {
    const config = parseConfig(
      [
        'auth_service:',
        '  listen_addr: "[::1]:3025"',
        '  public_addr: [localhost, "kube.e2e-cluster.local:443", auth.example.com., "[2001:db8::1]:3025", 10.0.0.255]',
        '',
      ].join('\n'),
      'config.yaml',
    );
    expect(config.auth_service.public_addr.map((a) => a.host)).toEqual(['localhost', 'kube.e2e-cluster.local', 'auth.example.com', '2001:db8::1', '10.0.0.255']);
  });

  it('suggests the nearest known key when the distance is small', () => {
    expect(failure('proxy_service:\n  web_listen_adr: ":443"\n').hint).toContain('`web_listen_addr`');
    expect(failure('gateway:\n  datadir: /x\n').hint).toContain('`data_dir`');
    expect(failure('auth_service:\n  Listen_Addr: ":3025"\n').hint).toContain('`listen_addr`');
  });

  it('points a key written in the wrong section at the right one', () => {
    expect(failure('proxy_service:\n  proxy_listener_mode: separate\n').hint).toContain('`auth_service`');
  });

  it('lists the known keys when nothing is close', () => {
    const hint = failure('ssh_service:\n  banana: 1\n').hint;
    for (const key of ['enabled', 'public_addr', 'listen_addr']) expect(hint).toContain(key);
  });

  it('reports every problem in one error, with the code of the first in the file', () => {
    const err = failure(
      [
        'gateway:',
        '  log:',
        '    severity: loud', // 3: value
        'proxy_service:',
        '  web_listen_adr: ":443"', // 5: unknown key
        '  public_addr: "a b"', // 6: address
      ].join('\n'),
    );
    expect(err.code).toBe('GW_ERR_CONFIG_VALUE');
    const problems = err.details.problems as Array<{ code: string; path: string; line: number }>;
    expect(problems.map((p) => [p.code, p.path, p.line])).toEqual([
      ['GW_ERR_CONFIG_VALUE', 'gateway.log.severity', 3],
      ['GW_ERR_CONFIG_UNKNOWN_KEY', 'proxy_service.web_listen_adr', 5],
      ['GW_ERR_CONFIG_ADDR', 'proxy_service.public_addr', 6],
    ]);
    for (const p of problems) expect(err.message).toContain(p.path);
  });

  it('reports one problem once (a bad version is not also a channel without a source)', () => {
    const err = failure('proxy_service:\n  automatic_upgrades_channels:\n    x:\n      static_version: "17"\n');
    expect((err.details.problems as unknown[]).length).toBe(1);
    expect(err.code).toBe('GW_ERR_CONFIG_VALUE');
  });

  it('names the source in every position', () => {
    const err = failure('gateway: 5\n', '/etc/gateway.yaml');
    expect(err.details.source).toBe('/etc/gateway.yaml');
    expect(err.message.startsWith('/etc/gateway.yaml:1:10: gateway:')).toBe(true);
  });

  it('keeps the password of a forward_url out of the message', () => {
    const err = failure('proxy_service:\n  automatic_upgrades_channels:\n    x:\n      forward_url: ftp://bob:hunter2@u.example.com/\n');
    expect(err.code).toBe('GW_ERR_CONFIG_VALUE');
    expect(err.message).not.toContain('hunter2');
  });
});

describe('loadConfigFile errors', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gateway-config-'));

  it('GW_ERR_CONFIG_READ names the path and the OS reason', () => {
    const path = join(dir, 'missing.yaml');
    let err: unknown;
    try {
      loadConfigFile(path);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(GatewayError);
    const gw = err as GatewayError;
    expect(gw.code).toBe('GW_ERR_CONFIG_READ');
    expect(gw.message).toContain(path);
    expect(gw.message).toContain('ENOENT');
    expect(gw.details.source).toBe(path);
  });

  it('GW_ERR_CONFIG_READ for a directory', () => {
    expect(() => loadConfigFile(dir)).toThrowError(expect.objectContaining({ code: 'GW_ERR_CONFIG_READ' }));
  });

  it('uses the path as the source of parse errors', () => {
    const path = join(dir, 'bad.yaml');
    writeFileSync(path, 'gateway:\n  nodename: [\n');
    try {
      loadConfigFile(path);
      expect.unreachable();
    } catch (e) {
      expect((e as GatewayError).code).toBe('GW_ERR_CONFIG_SYNTAX');
      expect((e as GatewayError).details.source).toBe(path);
    }
  });
});

describe('public_addr written as a URL', () => {
  it('is told to drop the scheme (not about IPv6 brackets), and the configuration with what the hint says loads', () => {
    const text = (addr: string) => `gateway:\n  data_dir: /var/lib/gateway\nproxy_service:\n  public_addr: ${addr}\n`;
    for (const url of ['https://gw.example.com', 'https://gw.example.com:443']) {
      const err = failure(text(url));
      expect(err.code).toBe('GW_ERR_CONFIG_ADDR');
      expect(err.hint).toBe('Drop the scheme: write host:port, here gw.example.com:443.');
      const instead = /here (\S+)\.$/.exec(err.hint!)![1]!;
      expect(parseConfig(text(instead), 'config.yaml').proxy_service.public_addr).toEqual([{ host: 'gw.example.com', port: 443 }]);
    }
  });
});
