/**
 * The PostgreSQL backend when things go wrong, on a real server with TLS: the server restarts, or the backend's
 * connections are killed, while a writer writes and a watcher (another Auth Service) watches; what the watcher
 * saw must be exactly the model's events (model.ts), in order. And logging in over TLS: with a client
 * certificate and no password, or with a password over a verified connection, and each way it is refused.
 */
import { existsSync } from 'node:fs';
import https from 'node:https';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { openPostgresBackend, type PostgresBackend, type PostgresBackendOptions, type WatchEvent } from '../../src/backend/index.js';
import type { GatewayError } from '../../src/errors.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { startGateway, startGatewayExpectingFailure } from '../helpers/gateway.js';
import { rootSuite } from '../helpers/root.js';
import { makeTestPki, type ServerCert, type TestPki } from '../helpers/tls.js';
import { settle } from './harness.js';
import { ManualClock, rejection } from './helpers.js';
import { Model } from './model.js';

const CERT_USER = 'gwcert';

let server: PostgresServer;
let pki: TestPki;
let otherPki: TestPki;
let client: ServerCert;
const backends: PostgresBackend[] = [];
let databases = 0;

/** A new database owned by the certificate user, and its connection string (no password). */
async function certDatabase(): Promise<string> {
  const name = `f${++databases}`;
  await server.sql(`CREATE DATABASE ${name} OWNER ${CERT_USER}`);
  return `postgresql://${CERT_USER}@127.0.0.1:${server.port}/${name}`;
}

async function open(connString: string, options: Partial<PostgresBackendOptions> = {}): Promise<PostgresBackend> {
  const b = await openPostgresBackend({ connString, sweepIntervalMs: 0, ...options });
  backends.push(b);
  return b;
}

/** Client-certificate login, the server verified against the test CA (sslmode verify-full, implied by the files). */
function certLogin(cert: ServerCert = client, ca: TestPki = pki): Partial<PostgresBackendOptions> {
  return { caFile: ca.caCertPath, certFile: cert.certPath, keyFile: cert.keyPath };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The cluster CA an Auth API serves at /webapi/ca. */
function caOf(address: string): Promise<string> {
  const port = Number(address.slice(address.lastIndexOf(':') + 1));
  return new Promise((resolve, reject) => {
    https
      .get({ host: '127.0.0.1', port, path: '/webapi/ca', rejectUnauthorized: false }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => (res.statusCode === 200 ? resolve(body) : reject(new Error(`GET /webapi/ca: ${res.statusCode} ${body}`))));
      })
      .on('error', reject);
  });
}

/**
 * Writes one op at a time (puts of new keys, every fifth a delete of an earlier one) and keeps the model in step.
 * A write that fails may have been applied or not (the connection went during COMMIT): once the server answers
 * again, the key tells, and the model follows what happened before the next write is made.
 */
function startWriter(b: PostgresBackend, model: Model) {
  let stop = false;
  let failures = 0;
  let n = 0;
  const state = { get failures() { return failures; }, get revision() { return model.revision; } };
  const resolveUnknown = async (key: string, deleted: boolean, value: string): Promise<void> => {
    for (;;) {
      try {
        const item = await b.get(key);
        if (deleted ? item === undefined : item?.value === value) {
          if (deleted) model.delete(key);
          else model.put('put', key, value);
        }
        return;
      } catch {
        await sleep(50); // the server is still away
      }
    }
  };
  const loop = (async () => {
    while (!stop) {
      n++;
      const deleting = n % 5 === 0 && model.live(`/r/${n - 3}`) !== undefined;
      const key = deleting ? `/r/${n - 3}` : `/r/${n}`;
      const value = JSON.stringify({ n });
      try {
        if (deleting) {
          await b.delete(key);
          model.delete(key);
        } else {
          await b.put(key, value);
          model.put('put', key, value);
        }
      } catch (err) {
        const code = (err as GatewayError).code;
        if (code !== 'GW_ERR_BACKEND_UNREACHABLE' && code !== 'GW_ERR_BACKEND_FAILED') throw err;
        failures++;
        await resolveUnknown(key, deleting, value);
      }
    }
  })();
  return {
    state,
    async stop(): Promise<void> {
      stop = true;
      await loop;
    },
  };
}

rootSuite(['dbUsers'])('postgres backend faults (a real PostgreSQL server with TLS)', () => {
  beforeAll(async () => {
    [pki, otherPki] = await Promise.all([makeTestPki(), makeTestPki()]);
    client = await pki.clientCert({ cn: CERT_USER });
    server = await startPostgres({ port: await getPort({ host: '127.0.0.1' }), tls: { pki, certUser: CERT_USER } });
  });
  afterAll(async () => {
    for (const b of backends.splice(0)) await b.close();
    await server?.stop();
    await pki?.cleanup();
    await otherPki?.cleanup();
  });

  describeTls();

  describeGatewayStart();

  describeFaults();
});

function describeTls(): void {
  describe('TLS', () => {
    it('logs in with a client certificate and no password, and with a password over verified TLS', async () => {
      const location = await certDatabase();
      const b = await open(location, certLogin());
      expect((await b.put('/a', '1')).revision).toBe(1);
      const roles = await server.sql(`SELECT usename || ' ' || ssl FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE application_name = 'gateway'`);
      expect(roles.trim().split('\n')).toContain(`${CERT_USER} true`);
      const withPassword = await open(`${server.url()}?sslmode=verify-full`, { caFile: pki.caCertPath });
      expect((await withPassword.put('/b', '1')).revision).toBe(1);
    });

    it('names each refusal: untrusted server, unknown client CA, certificate of another user, no certificate', async () => {
      const location = await certDatabase();
      const stranger = await otherPki.clientCert({ cn: CERT_USER });
      const someoneElse = await pki.clientCert({ cn: 'someone_else' });
      const cases: Array<[Partial<PostgresBackendOptions>, string, string]> = [
        [certLogin(client, otherPki), 'GW_ERR_CLIENT_UNTRUSTED', 'not trusted'],
        [certLogin(stranger), 'GW_ERR_BACKEND_TLS', 'client certificate'],
        [certLogin(someoneElse), 'GW_ERR_BACKEND_AUTH', 'certificate'],
        [{ caFile: pki.caCertPath }, 'GW_ERR_BACKEND_AUTH', 'certificate'],
        [{ ...certLogin(), keyFile: '/nonexistent/client.key' }, 'GW_ERR_BACKEND_TLS', '/nonexistent/client.key'],
      ];
      for (const [options, code, words] of cases) {
        const err = await rejection(openPostgresBackend({ connString: location, sweepIntervalMs: 0, ...options }));
        expect(err.code, JSON.stringify(options)).toBe(code);
        expect(`${err.message} ${err.hint}`, JSON.stringify(options)).toContain(words);
      }
    });
  });
}

function describeGatewayStart(): void {
  describe('gateway start', () => {
    const config = (connString: string, files: string[]) =>
      [
        'gateway:',
        '  data_dir: DATA_DIR',
        '  log: { format: json }',
        '  storage:',
        '    type: postgres',
        `    conn_string: "${connString}"`,
        ...files,
        'auth_service:',
        '  cluster_name: pg.example',
        '  listen_addr: 127.0.0.1:0',
        '',
      ].join('\n');

    it('runs two Auth Services on one database over TLS with client certificates; a refused login is named', async () => {
      const location = await certDatabase();
      const files = [`    ca_file: ${pki.caCertPath}`, `    cert_file: ${client.certPath}`, `    key_file: ${client.keyPath}`];
      const first = await startGateway(config(location, files));
      try {
        const second = await startGateway(config(location, files));
        try {
          // The cluster lives in PostgreSQL: both use its one CA set, and neither made a SQLite file.
          expect(existsSync(join(first.dataDir, 'backend.sqlite')) || existsSync(join(second.dataDir, 'backend.sqlite'))).toBe(false);
          const count = await server.sql('SELECT count(*) FROM gateway_kv', new URL(location).pathname.slice(1));
          expect(Number(count.trim())).toBeGreaterThan(0);
          const [ca1, ca2] = await Promise.all([first, second].map((g) => caOf(g.addresses.auth!)));
          expect(ca1).toBe(ca2);
        } finally {
          await second.stop();
        }
      } finally {
        await first.stop();
      }
      const refused = await startGatewayExpectingFailure(config(server.url().replace(server.password, 'Wrong-pw-77'), []), []);
      expect(refused.status).toBe(1);
      expect(refused.stderr).toContain('code: GW_ERR_BACKEND_AUTH');
      expect(refused.stderr).toContain(':***@127.0.0.1');
      expect(refused.stderr).not.toContain('Wrong-pw-77');
    });
  });
}

function describeFaults(): void {
  describe('restart and dropped connections', () => {
    /** A writer and a watcher (two Auth Services) on a new database; checks the watcher against the model. */
    async function scenario(fault: (writer: ReturnType<typeof startWriter>['state']) => Promise<void>): Promise<void> {
      const location = await certDatabase();
      const model = new Model(new ManualClock());
      const writer = await open(location, certLogin());
      const watcher = await open(location, certLogin());
      const seen: WatchEvent[] = [];
      watcher.watch('', (e) => seen.push(e));
      const w = startWriter(writer, model);
      try {
        await vi.waitFor(() => expect(w.state.revision).toBeGreaterThanOrEqual(20), { timeout: 30_000 });
        await fault(w.state);
        const after = w.state.revision;
        await vi.waitFor(() => expect(w.state.revision).toBeGreaterThanOrEqual(after + 20), { timeout: 30_000 });
      } finally {
        await w.stop();
      }
      await settle(watcher);
      expect(seen.length).toBe(model.events.length);
      expect(seen).toStrictEqual(model.events);
      // And the data itself: what the model holds, nothing else.
      expect(await watcher.range('')).toStrictEqual(model.range(''));
    }

    it('the server restarts: the watcher resumes with no missed event, checked against the model', async () => {
      await scenario(async (writer) => {
        await server.halt();
        // Writes fail while the server is away: wait until the writer has met that, then bring it back.
        await vi.waitFor(() => expect(writer.failures).toBeGreaterThan(0), { timeout: 30_000 });
        await server.resume();
      });
    });

    it('the backends connections are killed (pg_terminate_backend): nothing is missed or reordered', async () => {
      await scenario(async (writer) => {
        for (let round = 1; round <= 3; round++) {
          const before = writer.revision;
          await server.sql(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '${CERT_USER}'`);
          await vi.waitFor(() => expect(writer.revision).toBeGreaterThan(before + 5), { timeout: 30_000 });
        }
      });
    });
  });
}
