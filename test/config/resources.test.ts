/**
 * Agents' resources and tunnel heartbeats: auth_service.keep_alive_*, ssh_service.labels, db_service.databases,
 * app_service.apps, windows_desktop_service.desktops, kube_service.clusters.
 */
import { describe, expect, it } from 'vitest';
import { defaultConfig, parseConfig, sampleConfig, type GatewayConfig } from '../../src/config/index.js';
import { GatewayError, type ErrorCode } from '../../src/errors.js';

const parse = (text: string): GatewayConfig => parseConfig(text, 'config.yaml');

function failure(text: string): GatewayError {
  try {
    parseConfig(text, 'config.yaml');
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  throw new Error(`parseConfig accepted:\n${text}`);
}

describe('defaults', () => {
  it('heartbeats every 15 s, 3 missed in a row', () => {
    const c = defaultConfig();
    expect(c.auth_service.keep_alive_interval).toBe(15_000);
    expect(c.auth_service.keep_alive_count_max).toBe(3);
  });

  it('no labels, no resources', () => {
    const c = defaultConfig();
    expect(c.ssh_service.labels).toEqual({});
    expect(c.db_service.databases).toEqual([]);
    expect(c.app_service.apps).toEqual([]);
    expect(c.windows_desktop_service.desktops).toEqual([]);
    expect(c.kube_service.clusters).toEqual([]);
  });

  it.each([
    ['empty sections', 'ssh_service:\ndb_service:\napp_service:\nkube_service:\nwindows_desktop_service:\n'],
    ['keys with no value', 'ssh_service:\n  labels:\ndb_service:\n  databases:\napp_service:\n  apps: ~\nkube_service:\n  clusters:\nwindows_desktop_service:\n  desktops:\n'],
    ['empty collections', 'ssh_service: {labels: {}}\ndb_service: {databases: []}\napp_service: {apps: []}\nkube_service: {clusters: []}\nwindows_desktop_service: {desktops: []}\n'],
  ])('%s give the defaults', (_what, text) => {
    const c = parse(text);
    expect(c.ssh_service.labels).toEqual({});
    expect([c.db_service.databases, c.app_service.apps, c.kube_service.clusters, c.windows_desktop_service.desktops]).toEqual([[], [], [], []]);
  });

  it('the sample shows the new keys and still parses to the defaults', () => {
    const sample = sampleConfig();
    for (const line of ['keep_alive_interval: 15s', 'keep_alive_count_max: 3', 'labels: {}', 'databases: []', 'apps: []', 'clusters: []', 'desktops: []']) {
      expect(sample).toContain(line);
    }
    expect(parseConfig(sample, 'sample.yaml')).toEqual(defaultConfig());
  });
});

describe('heartbeats', () => {
  it.each([
    ['20s', 20_000],
    ['500ms', 500],
    ['1m30s', 90_000],
  ])('keep_alive_interval %s', (text, ms) => {
    expect(parse(`auth_service:\n  keep_alive_interval: ${text}\n`).auth_service.keep_alive_interval).toBe(ms);
  });

  it.each([1, 3, 100])('keep_alive_count_max %i', (n) => {
    expect(parse(`auth_service:\n  keep_alive_count_max: ${n}\n`).auth_service.keep_alive_count_max).toBe(n);
  });
});

describe('labels', () => {
  it('names with dots, dashes, underscores and slashes; quoted numbers and booleans; empty values', () => {
    const c = parse(
      'ssh_service:\n  labels:\n    env: prod\n    gateway.dev/region: eu-west-1\n    Team_Name-2: "42"\n    canary: "true"\n    note: ""\n    2024: q1\n',
    );
    expect(c.ssh_service.labels).toEqual({
      env: 'prod',
      'gateway.dev/region': 'eu-west-1',
      'Team_Name-2': '42',
      canary: 'true',
      note: '',
      '2024': 'q1',
    });
  });

  it('flow style; a name such as __proto__ stays a plain key; frozen', () => {
    const labels = parse('ssh_service:\n  labels: {__proto__: x, a: b}\n').ssh_service.labels;
    expect(Object.keys(labels)).toEqual(['__proto__', 'a']);
    expect(Object.getPrototypeOf(labels)).toBe(Object.prototype);
    expect(Object.isFrozen(labels)).toBe(true);
  });

  it('63 characters per part and 256 per value are allowed', () => {
    const name = `${'a'.repeat(63)}/${'b'.repeat(63)}`;
    const value = 'v'.repeat(256);
    expect(parse(`ssh_service:\n  labels:\n    ${name}: ${value}\n`).ssh_service.labels).toEqual({ [name]: value });
  });

  it('every resource has labels', () => {
    const c = parse(
      [
        'db_service:',
        '  databases: [{name: d, protocol: redis, uri: "r:6379", labels: {env: prod}}]',
        'app_service:',
        '  apps: [{name: a, uri: "http://a:1", labels: {env: dev}}]',
        'kube_service:',
        '  clusters: [{name: k, api_server: "https://k:6443", labels: {env: qa}}]',
        'windows_desktop_service:',
        '  desktops: [{name: w, addr: w.internal, labels: {env: lab}}]',
      ].join('\n'),
    );
    expect(c.db_service.databases[0]!.labels).toEqual({ env: 'prod' });
    expect(c.app_service.apps[0]!.labels).toEqual({ env: 'dev' });
    expect(c.kube_service.clusters[0]!.labels).toEqual({ env: 'qa' });
    expect(c.windows_desktop_service.desktops[0]!.labels).toEqual({ env: 'lab' });
  });
});

describe('db_service.databases', () => {
  it('round-trips to typed values', () => {
    const c = parse(
      [
        'db_service:',
        '  databases:',
        '    - name: orders',
        '      protocol: postgres',
        '      uri: Orders-DB.Internal.:5432',
        '      labels: {env: prod}',
        '    - name: cache-1',
        '      protocol: REDIS',
        '      uri: "[2001:db8::5]:6379"',
        '    - {name: users, protocol: mysql, uri: "10.0.0.7:3306"}',
        '    - {name: docs, protocol: MongoDB, uri: "mongo.internal:27017"}',
      ].join('\n'),
    );
    expect(c.db_service.databases).toEqual([
      { name: 'orders', protocol: 'postgres', uri: { host: 'orders-db.internal', port: 5432 }, labels: { env: 'prod' } },
      { name: 'cache-1', protocol: 'redis', uri: { host: '2001:db8::5', port: 6379 }, labels: {} },
      { name: 'users', protocol: 'mysql', uri: { host: '10.0.0.7', port: 3306 }, labels: {} },
      { name: 'docs', protocol: 'mongodb', uri: { host: 'mongo.internal', port: 27017 }, labels: {} },
    ]);
    expect(Object.isFrozen(c.db_service.databases)).toBe(true);
    expect(Object.isFrozen(c.db_service.databases[0]!.uri)).toBe(true);
  });

  it('a name may be 63 characters', () => {
    const name = `a${'-'.repeat(61)}z`;
    expect(parse(`db_service:\n  databases: [{name: ${name}, protocol: postgres, uri: "d:1"}]\n`).db_service.databases[0]!.name).toBe(name);
  });
});

describe('app_service.apps', () => {
  it('round-trips, with the URI normalised', () => {
    const c = parse(
      [
        'app_service:',
        '  apps:',
        '    - name: grafana',
        '      uri: HTTP://Grafana.Internal:3000/',
        '      public_addr: Grafana.Gateway.Example.COM.',
        '      labels: {team: observability}',
        '    - name: wiki',
        '      uri: https://wiki.internal:443/app/',
        '    - name: plain',
        '      uri: http://10.0.0.9:80',
        '    - name: v6',
        '      uri: "http://[2001:db8::9]:8080/x"',
        '    - name: erp',
        '      uri: tcp://ERP.internal:9000',
      ].join('\n'),
    );
    expect(c.app_service.apps).toEqual([
      { name: 'grafana', uri: 'http://grafana.internal:3000', public_addr: 'grafana.gateway.example.com', labels: { team: 'observability' } },
      { name: 'wiki', uri: 'https://wiki.internal/app/', public_addr: undefined, labels: {} },
      { name: 'plain', uri: 'http://10.0.0.9', public_addr: undefined, labels: {} },
      { name: 'v6', uri: 'http://[2001:db8::9]:8080/x', public_addr: undefined, labels: {} },
      { name: 'erp', uri: 'tcp://erp.internal:9000', public_addr: undefined, labels: {} },
    ]);
  });
});

describe('windows_desktop_service.desktops', () => {
  it('round-trips; the port defaults to 3389', () => {
    const c = parse(
      'windows_desktop_service:\n  desktops:\n    - name: build-win\n      addr: 10.0.0.20\n      labels: {env: dev}\n    - name: jump\n      addr: Jump.Internal:3390\n    - name: v6\n      addr: "[2001:db8::20]"\n',
    );
    expect(c.windows_desktop_service.desktops).toEqual([
      { name: 'build-win', addr: { host: '10.0.0.20', port: 3389 }, labels: { env: 'dev' } },
      { name: 'jump', addr: { host: 'jump.internal', port: 3390 }, labels: {} },
      { name: 'v6', addr: { host: '2001:db8::20', port: 3389 }, labels: {} },
    ]);
  });
});

const NO_CREDENTIALS = { credentials: 'none', service_account_dir: '/var/run/secrets/kubernetes.io/serviceaccount', kubeconfig: undefined, kubeconfig_context: undefined };

describe('kube_service.clusters', () => {
  it('round-trips', () => {
    const c = parse(
      'kube_service:\n  clusters:\n    - name: prod\n      api_server: https://Kube.Internal:6443\n      ca_file: /etc/gateway/kube-ca.pem\n      labels: {env: prod}\n    - name: rancher\n      api_server: https://rancher.internal/k8s/clusters/c-m-1\n',
    );
    expect(c.kube_service.clusters).toEqual([
      { name: 'prod', api_server: 'https://kube.internal:6443', ca_file: '/etc/gateway/kube-ca.pem', labels: { env: 'prod' }, ...NO_CREDENTIALS },
      { name: 'rancher', api_server: 'https://rancher.internal/k8s/clusters/c-m-1', ca_file: undefined, labels: {}, ...NO_CREDENTIALS },
    ]);
  });

  it('credentials: in_cluster with its directory, or kubeconfig with its file and context', () => {
    const c = parse(
      'kube_service:\n  clusters:\n    - {name: a, api_server: "https://kubernetes.default.svc", credentials: in_cluster, service_account_dir: /sa}\n    - {name: b, api_server: "https://k:6443", credentials: kubeconfig, kubeconfig: /etc/k.yaml, kubeconfig_context: prod}\n',
    );
    expect(c.kube_service.clusters.map((k) => [k.credentials, k.service_account_dir, k.kubeconfig, k.kubeconfig_context])).toEqual([
      ['in_cluster', '/sa', undefined, undefined],
      ['kubeconfig', '/var/run/secrets/kubernetes.io/serviceaccount', '/etc/k.yaml', 'prod'],
    ]);
    expect(failure('kube_service: {clusters: [{name: a, api_server: "https://k", credentials: token}]}').code).toBe('GW_ERR_CONFIG_VALUE');
    expect(failure('kube_service: {clusters: [{name: a, api_server: "https://k", credentials: in_cluster, service_account_dir: sa}]}').code).toBe('GW_ERR_CONFIG_VALUE');
  });
});

describe('the same name in different lists is fine', () => {
  it('db, app, desktop and cluster named "prod"', () => {
    const c = parse(
      'db_service: {databases: [{name: prod, protocol: postgres, uri: "d:5432"}]}\napp_service: {apps: [{name: prod, uri: "http://a"}]}\nwindows_desktop_service: {desktops: [{name: prod, addr: w}]}\nkube_service: {clusters: [{name: prod, api_server: "https://k"}]}\n',
    );
    expect([c.db_service.databases, c.app_service.apps, c.windows_desktop_service.desktops, c.kube_service.clusters].map((l) => l[0]!.name)).toEqual([
      'prod',
      'prod',
      'prod',
      'prod',
    ]);
  });
});

/** [what, YAML text, code, key path, line, column] — the position of the offending key, item or value. */
type Case = [string, string, ErrorCode, string, number, number];

const DB = 'db_service:\n  databases:\n';
const APP = 'app_service:\n  apps:\n';
const DESK = 'windows_desktop_service:\n  desktops:\n';
const KUBE = 'kube_service:\n  clusters:\n';

const cases: Case[] = [
  // --- the cases asked for -------------------------------------------------------------------------------------
  [
    'duplicate database names',
    `${DB}    - name: main\n      protocol: postgres\n      uri: db1.internal:5432\n    - name: main\n      protocol: mysql\n      uri: db2.internal:3306\n`,
    'GW_ERR_CONFIG_VALUE',
    'db_service.databases[1]',
    6,
    7,
  ],
  ['unknown protocol', `${DB}    - name: main\n      protocol: oracle\n      uri: db.internal:1521\n`, 'GW_ERR_CONFIG_VALUE', 'db_service.databases[0].protocol', 4, 17],
  ['database uri without port', `${DB}    - name: main\n      protocol: postgres\n      uri: db.internal\n`, 'GW_ERR_CONFIG_ADDR', 'db_service.databases[0].uri', 5, 12],
  ['app with ftp:// uri', `${APP}    - name: files\n      uri: ftp://files.internal:21\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[0].uri', 4, 12],
  ['tcp:// app without port', `${APP}    - name: erp\n      uri: tcp://erp.internal\n`, 'GW_ERR_CONFIG_ADDR', 'app_service.apps[0].uri', 4, 12],
  ['desktop addr with a port out of range', `${DESK}    - name: win\n      addr: 10.0.0.20:99999\n`, 'GW_ERR_CONFIG_ADDR', 'windows_desktop_service.desktops[0].addr', 4, 13],
  ['desktop addr with a port that is not a number', `${DESK}    - name: win\n      addr: win.internal:rdp\n`, 'GW_ERR_CONFIG_ADDR', 'windows_desktop_service.desktops[0].addr', 4, 13],
  ['api_server that is http://', `${KUBE}    - name: prod\n      api_server: http://kube.internal:8080\n`, 'GW_ERR_CONFIG_VALUE', 'kube_service.clusters[0].api_server', 4, 19],
  ['label with a number value', 'ssh_service:\n  labels:\n    env: prod\n    version: 14\n', 'GW_ERR_CONFIG_TYPE', 'ssh_service.labels.version', 4, 14],
  ['label of a resource with a number value', `${DB}    - name: main\n      protocol: postgres\n      uri: "db:5432"\n      labels: {tier: 1}\n`, 'GW_ERR_CONFIG_TYPE', 'db_service.databases[0].labels.tier', 6, 22],
  ['keep_alive_count_max 0', 'auth_service:\n  keep_alive_count_max: 0\n', 'GW_ERR_CONFIG_VALUE', 'auth_service.keep_alive_count_max', 2, 25],
  ['keep_alive_count_max 101', 'auth_service:\n  keep_alive_count_max: 101\n', 'GW_ERR_CONFIG_VALUE', 'auth_service.keep_alive_count_max', 2, 25],
  ['keep_alive_interval "soon"', 'auth_service:\n  keep_alive_interval: soon\n', 'GW_ERR_CONFIG_VALUE', 'auth_service.keep_alive_interval', 2, 24],

  // --- heartbeats ----------------------------------------------------------------------------------------------
  ['keep_alive_count_max quoted', 'auth_service:\n  keep_alive_count_max: "3"\n', 'GW_ERR_CONFIG_TYPE', 'auth_service.keep_alive_count_max', 2, 25],
  ['keep_alive_count_max 2.5', 'auth_service:\n  keep_alive_count_max: 2.5\n', 'GW_ERR_CONFIG_TYPE', 'auth_service.keep_alive_count_max', 2, 25],
  ['keep_alive_interval without a unit', 'auth_service:\n  keep_alive_interval: 20\n', 'GW_ERR_CONFIG_TYPE', 'auth_service.keep_alive_interval', 2, 24],
  ['keep_alive_interval 0s', 'auth_service:\n  keep_alive_interval: 0s\n', 'GW_ERR_CONFIG_VALUE', 'auth_service.keep_alive_interval', 2, 24],

  // --- labels --------------------------------------------------------------------------------------------------
  ['label with a boolean value', 'ssh_service:\n  labels:\n    canary: true\n', 'GW_ERR_CONFIG_TYPE', 'ssh_service.labels.canary', 3, 13],
  ['label with a list value', 'ssh_service:\n  labels:\n    env: [a, b]\n', 'GW_ERR_CONFIG_TYPE', 'ssh_service.labels.env', 3, 10],
  ['label with no value', 'ssh_service:\n  labels:\n    env:\n', 'GW_ERR_CONFIG_TYPE', 'ssh_service.labels.env', 3, 5],
  ['label name with a space', 'ssh_service:\n  labels:\n    "my env": prod\n', 'GW_ERR_CONFIG_VALUE', 'ssh_service.labels.my env', 3, 5],
  ['label name with an empty part', 'ssh_service:\n  labels:\n    gateway.dev//env: prod\n', 'GW_ERR_CONFIG_VALUE', 'ssh_service.labels.gateway.dev//env', 3, 5],
  ['label name part of 64 characters', `ssh_service:\n  labels:\n    x/${'a'.repeat(64)}: prod\n`, 'GW_ERR_CONFIG_VALUE', `ssh_service.labels.x/${'a'.repeat(64)}`, 3, 5],
  ['label value of 257 characters', `ssh_service:\n  labels:\n    env: ${'v'.repeat(257)}\n`, 'GW_ERR_CONFIG_VALUE', 'ssh_service.labels.env', 3, 10],
  ['labels as a list', 'ssh_service:\n  labels: [env, prod]\n', 'GW_ERR_CONFIG_TYPE', 'ssh_service.labels', 2, 11],
  ['labels as a string', 'ssh_service:\n  labels: env=prod\n', 'GW_ERR_CONFIG_TYPE', 'ssh_service.labels', 2, 11],
  ['duplicate label', 'ssh_service:\n  labels:\n    env: a\n    env: b\n', 'GW_ERR_CONFIG_DUPLICATE_KEY', 'ssh_service.labels.env', 4, 5],
  ['labels under db_service itself', 'db_service:\n  labels: {env: prod}\n', 'GW_ERR_CONFIG_UNKNOWN_KEY', 'db_service.labels', 2, 3],

  // --- lists and items -----------------------------------------------------------------------------------------
  ['databases as a mapping', 'db_service:\n  databases: {name: main}\n', 'GW_ERR_CONFIG_TYPE', 'db_service.databases', 2, 14],
  ['an empty item', `${APP}    - name: a\n      uri: http://a\n    -\n`, 'GW_ERR_CONFIG_TYPE', 'app_service.apps[1]', 5, 6],
  ['an item that is a string', `${DB}    - main\n`, 'GW_ERR_CONFIG_TYPE', 'db_service.databases[0]', 3, 7],
  ['an item that is an alias to nothing', `gateway:\n  nodename: &none\n${DB}    - *none\n`, 'GW_ERR_CONFIG_TYPE', 'db_service.databases[0]', 5, 7],
  ['missing name', `${DB}    - protocol: postgres\n      uri: db:5432\n`, 'GW_ERR_CONFIG_VALUE', 'db_service.databases[0].name', 3, 7],
  ['name with no value', `${DESK}    - name:\n      addr: w\n`, 'GW_ERR_CONFIG_VALUE', 'windows_desktop_service.desktops[0].name', 3, 7],
  ['misspelt key in an item', `${DB}    - name: main\n      protocol: postgres\n      url: db:5432\n`, 'GW_ERR_CONFIG_UNKNOWN_KEY', 'db_service.databases[0].url', 5, 7],
  ['name with capitals', `${KUBE}    - name: Prod\n      api_server: https://k\n`, 'GW_ERR_CONFIG_VALUE', 'kube_service.clusters[0].name', 3, 13],
  ['name starting with a digit', `${DESK}    - name: 1st\n      addr: w\n`, 'GW_ERR_CONFIG_VALUE', 'windows_desktop_service.desktops[0].name', 3, 13],
  ['name of 64 characters', `${APP}    - name: ${'a'.repeat(64)}\n      uri: http://a\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[0].name', 3, 13],
  ['name with an underscore', `${APP}    - name: my_app\n      uri: http://a\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[0].name', 3, 13],
  ['duplicate app names', `${APP}    - {name: a, uri: "http://a"}\n    - {name: b, uri: "http://b"}\n    - {name: a, uri: "tcp://c:1"}\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[2]', 5, 7],
  ['duplicate desktop names', `${DESK}    - {name: w, addr: a}\n    - {name: w, addr: b}\n`, 'GW_ERR_CONFIG_VALUE', 'windows_desktop_service.desktops[1]', 4, 7],
  ['duplicate cluster names', `${KUBE}    - {name: k, api_server: "https://a"}\n    - {name: k, api_server: "https://b"}\n`, 'GW_ERR_CONFIG_VALUE', 'kube_service.clusters[1]', 4, 7],

  // --- addresses and URIs --------------------------------------------------------------------------------------
  ['database uri with port 0', `${DB}    - {name: d, protocol: postgres, uri: "db:0"}\n`, 'GW_ERR_CONFIG_ADDR', 'db_service.databases[0].uri', 3, 42],
  ['database uri as a URL', `${DB}    - {name: d, protocol: postgres, uri: "postgres://db:5432"}\n`, 'GW_ERR_CONFIG_ADDR', 'db_service.databases[0].uri', 3, 42],
  ['database uri as a number', `${DB}    - {name: d, protocol: redis, uri: 6379}\n`, 'GW_ERR_CONFIG_TYPE', 'db_service.databases[0].uri', 3, 39],
  ['desktop addr that is not a host', `${DESK}    - {name: w, addr: "bad host"}\n`, 'GW_ERR_CONFIG_ADDR', 'windows_desktop_service.desktops[0].addr', 3, 23],
  ['app uri without a scheme', `${APP}    - {name: a, uri: "grafana.internal:3000"}\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[0].uri', 3, 22],
  ['app uri with a bad host', `${APP}    - {name: a, uri: "http://bad host:3000"}\n`, 'GW_ERR_CONFIG_ADDR', 'app_service.apps[0].uri', 3, 22],
  ['app uri with a bad port', `${APP}    - {name: a, uri: "https://a:70000"}\n`, 'GW_ERR_CONFIG_ADDR', 'app_service.apps[0].uri', 3, 22],
  ['app uri with a password', `${APP}    - {name: a, uri: "https://bob:hunter2@a.internal"}\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[0].uri', 3, 22],
  ['app uri with a query', `${APP}    - {name: a, uri: "http://a/x?y=1"}\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[0].uri', 3, 22],
  ['tcp:// app with a path', `${APP}    - {name: a, uri: "tcp://a:1/x"}\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[0].uri', 3, 22],
  ['public_addr with a port', `${APP}    - {name: a, uri: "http://a", public_addr: "a.example.com:443"}\n`, 'GW_ERR_CONFIG_ADDR', 'app_service.apps[0].public_addr', 3, 47],
  ['public_addr that is an IP', `${APP}    - {name: a, uri: "http://a", public_addr: 203.0.113.5}\n`, 'GW_ERR_CONFIG_ADDR', 'app_service.apps[0].public_addr', 3, 47],
  ['public_addr for a tcp:// app', `${APP}    - name: erp\n      uri: tcp://erp.internal:9000\n      public_addr: erp.example.com\n`, 'GW_ERR_CONFIG_VALUE', 'app_service.apps[0].public_addr', 5, 20],
  ['api_server that is not a URL', `${KUBE}    - {name: k, api_server: kube.internal:6443}\n`, 'GW_ERR_CONFIG_VALUE', 'kube_service.clusters[0].api_server', 3, 29],
  ['relative ca_file', `${KUBE}    - {name: k, api_server: "https://k", ca_file: ca.pem}\n`, 'GW_ERR_CONFIG_VALUE', 'kube_service.clusters[0].ca_file', 3, 51],
];

describe('errors', () => {
  it.each(cases)('%s', (_what, text, code, path, line, column) => {
    const err = failure(text);
    expect({ code: err.code, path: err.details.path, line: err.details.line, column: err.details.column }).toEqual({ code, path, line, column });
    expect(err.details.source).toBe('config.yaml');
    expect(err.message).toContain(`config.yaml:${line}:${column}: ${path}: `);
    expect(err.hint.length).toBeGreaterThan(0);
    expect((err.details.problems as unknown[]).length).toBe(1);
  });

  it('a number or boolean label value gets a hint to quote it', () => {
    const err = failure('ssh_service:\n  labels:\n    version: 14\n');
    expect(err.message).toContain('expected a string, got 14');
    expect(err.hint).toContain('version: "14"');
    expect(parse('ssh_service:\n  labels:\n    canary: yes\n').ssh_service.labels).toEqual({ canary: 'yes' }); // YAML 1.2: a string
    expect(failure('ssh_service:\n  labels:\n    canary: true\n').hint).toContain('canary: "true"');
  });

  it('a duplicate name names the first item', () => {
    const err = failure(`${DB}    - {name: main, protocol: postgres, uri: "a:1"}\n    - {name: main, protocol: mysql, uri: "b:2"}\n`);
    expect(err.message).toContain('duplicate value "main" (same as db_service.databases[0])');
  });

  it('a missing port says so', () => {
    expect(failure(`${DB}    - {name: d, protocol: postgres, uri: db.internal}\n`).message).toContain('(the port is required)');
    expect(failure(`${APP}    - {name: a, uri: "tcp://a"}\n`).message).toContain('(the port is required)');
  });

  it('a database uri written as a URL is told to drop the scheme', () => {
    expect(failure(`${DB}    - {name: d, protocol: postgres, uri: "postgres://db:5432"}\n`).message).toContain('(write the address without a scheme)');
  });

  it('keeps a password in an app URI out of the message', () => {
    const err = failure(`${APP}    - {name: a, uri: "https://bob:hunter2@a.internal"}\n`);
    expect(err.message).not.toContain('hunter2');
  });

  it('a bad item is reported once and the other items are still checked', () => {
    const err = failure(`${DB}    - {name: a, protocol: oracle, uri: "a:1"}\n    - {name: b, protocol: mysql, uri: b}\n    - {name: a, protocol: mysql, uri: "c:3"}\n`);
    const problems = err.details.problems as Array<{ code: string; path: string; line: number }>;
    expect(problems.map((p) => [p.code, p.path, p.line])).toEqual([
      ['GW_ERR_CONFIG_VALUE', 'db_service.databases[0].protocol', 3],
      ['GW_ERR_CONFIG_ADDR', 'db_service.databases[1].uri', 4],
    ]);
  });
});
