import { describe, expect, it } from 'vitest';
import { backendConfigOf } from '../../src/backend/index.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { GatewayError } from '../../src/errors.js';

const parse = (text: string): GatewayConfig => parseConfig(text, 'config.yaml');

interface Problem {
  code: string;
  path: string;
  message: string;
}

/** The problems parseConfig reports for text, and the error's whole text (message and hint). */
function problems(text: string): Problem[] & { text: string } {
  try {
    parse(text);
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    const e = err as GatewayError;
    return Object.assign([...(e.details.problems as Problem[])], { text: `${e.message}\n${e.hint}\n${JSON.stringify(e.details)}` });
  }
  throw new Error(`accepted:\n${text}`);
}

describe('gateway.storage', () => {
  it('defaults to sqlite in the data directory', () => {
    const c = parse('gateway:\n  data_dir: /srv/gw\n');
    expect(c.gateway.storage).toEqual({ type: 'sqlite', conn_string: undefined, ca_file: undefined, cert_file: undefined, key_file: undefined });
    expect(backendConfigOf(c)).toEqual({ type: 'sqlite', path: '/srv/gw/backend.sqlite' });
  });

  it('reads postgres with a connection string and TLS files', () => {
    const c = parse(
      [
        'gateway:',
        '  storage:',
        '    type: PostgreS',
        '    conn_string: postgresql://gateway@db.internal:5432/gateway?sslmode=verify-full',
        '    ca_file: /etc/gw/ca.pem',
        '    cert_file: /etc/gw/client.pem',
        '    key_file: /etc/gw/client.key',
        '',
      ].join('\n'),
    );
    expect(c.gateway.storage.type).toBe('postgres');
    expect(backendConfigOf(c)).toEqual({
      type: 'postgres',
      connString: 'postgresql://gateway@db.internal:5432/gateway?sslmode=verify-full',
      caFile: '/etc/gw/ca.pem',
      certFile: '/etc/gw/client.pem',
      keyFile: '/etc/gw/client.key',
    });
  });

  it('needs conn_string for postgres', () => {
    expect([...problems('gateway:\n  storage:\n    type: postgres\n')]).toEqual([
      expect.objectContaining({ code: 'GW_ERR_CONFIG_VALUE', path: 'gateway.storage.conn_string' }),
    ]);
  });

  it('refuses PostgreSQL keys for sqlite, and a certificate without its key', () => {
    const found = problems('gateway:\n  storage:\n    conn_string: postgresql://db/gw\n    cert_file: /etc/gw/client.pem\n');
    expect(found.map((p) => p.path)).toEqual(['gateway.storage.conn_string', 'gateway.storage.cert_file', 'gateway.storage.key_file']);
    expect(found[0]!.message).toContain('type postgres');
  });

  it.each([
    ['not a URL', 'host=db user=gw password=hunter2x', 'postgresql://'],
    ['an unknown parameter', 'postgresql://gw:hunter2x@db/gw?sslcert=/tmp/x', 'sslcert'],
    ['sslmode=prefer', 'postgresql://gw:hunter2x@db/gw?sslmode=prefer', 'plain text'],
    ['no database', 'postgresql://gw:hunter2x@db:5432', 'no database'],
    ['no host', 'postgresql://gw:hunter2x@/gw', 'no host'],
    ['TLS over a socket', 'postgresql://gw:hunter2x@/gw?host=/run/postgresql&sslmode=verify-full', 'unix socket'],
    ['several hosts', 'postgresql://gw:hunter2x@db1,db2/gw', 'several hosts'],
  ])('refuses a connection string with %s, never showing its password', (_what, conn, words) => {
    const found = problems(`gateway:\n  storage:\n    type: postgres\n    conn_string: "${conn}"\n`);
    expect(found).toHaveLength(1);
    expect(found[0]!.path).toBe('gateway.storage.conn_string');
    expect(found.text).toContain(words);
    expect(found.text).not.toContain('hunter2x');
  });

  it('refuses relative TLS file paths', () => {
    const found = problems('gateway:\n  storage:\n    type: postgres\n    conn_string: postgresql://db/gw\n    ca_file: ca.pem\n');
    expect(found.map((p) => p.path)).toEqual(['gateway.storage.ca_file']);
  });
});
