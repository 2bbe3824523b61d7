/**
 * Restarts that keep sessions (src/handover.ts), end to end with the real binaries and the real psql: a cluster
 * (auth + proxy) and an agent serving PostgreSQL, a user signed in with `gwsh login`, psql through
 * `gwsh proxy db`. In order, on one agent:
 *
 *   1. a successor that cannot start (its configuration, re-read, is broken): the old process keeps serving and
 *      logs GW_ERR_HANDOVER_FAILED;
 *   2. SIGUSR2 twice: one successor (the second ask is refused, GW_ERR_HANDOVER_BUSY); a psql session opened
 *      before goes on in the old process (typed into after the hand-over, then ended normally), a new session
 *      reaches the successor (its own pid), and the old process exits once its session ended;
 *   3. SIGTERM on the successor: a session in flight goes on, a new one is refused (GW_ERR_AGENT_DRAINING);
 *      the drain limit closes what is left (GW_ERR_DRAIN_LIMIT), and the process exits;
 *   4. the agent started again on the same data directory: SIGTERM drains, a second SIGTERM exits at once with
 *      the session still open (which then ends).
 *
 * Nothing here asserts how fast anything happens (log lines and outputs are waited for with generous deadlines).
 */
import type { ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { runCli, runProgram, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { rootSuite } from '../helpers/root.js';
import { waitUntil } from '../helpers/wait.js';
import { openInteractive } from '../helpers/interactive.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';

const describeAsRoot = rootSuite(['dbUsers']);
const PASSWORD = 'correct horse battery';

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let proxyAddr: string;
let pg: PostgresServer;
let pgPort: number;
let port: number;
let gwshOutput: () => string;
let successorPid: number | undefined;
const children: ChildProcess[] = [];

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const env = () => ({ HOME: dir, GWSH_HOME: join(dir, 'gwsh-alice') });
const conn = () => `host=127.0.0.1 port=${port} user=${pg.user} dbname=${pg.user} sslmode=disable connect_timeout=10`;
const psql = (sql: string) => runProgram('psql', [conn(), '-X', '-At', '-c', sql], { env: { HOME: dir, PGPASSWORD: pg.password } });

const agentConfig = (drain: string, extra = '') =>
  ['gateway:', '  nodename: db-agent', '  data_dir: DATA_DIR', '  log: { format: json }', `  drain_limit: ${drain}`, '  drain_on_stop: yes', 'db_service:', '  enabled: yes', '  databases:',
    `    - { name: pg, protocol: postgres, uri: 127.0.0.1:${pgPort} }`, extra].join('\n');

/** An interactive psql (test/helpers/interactive.ts): send() types a line, and waitFor() the text it prints. */
const openPsql = () => openInteractive('psql', 'psql', [conn(), '-X', '-At'], { HOME: dir, PGPASSWORD: pg.password }, children);

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-handover-'));
  await chmod(dir, 0o755);
  pgPort = (await getPort())!;
  const webPort = await getPort({ host: '127.0.0.1' });
  proxyAddr = `127.0.0.1:${webPort}`;
  [pg, cluster] = await Promise.all([
    startPostgres({ port: pgPort }),
    startGateway(['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: handover.example', '  listen_addr: 127.0.0.1:0',
      'proxy_service:', `  web_listen_addr: ${proxyAddr}`, `  public_addr: ${proxyAddr}`, ''].join('\n')),
  ]);
  const pin = /CA pin:\s+(\S+)/.exec((await gwctl(['status'])).stdout)![1]!;
  expect((await gwctl(['users', 'add', 'alice', '--roles=access', `--db-users=${pg.user}`, `--db-names=${pg.user}`], `${PASSWORD}\n`)).stderr).toBe('');
  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=db', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(agentConfig('60s'), { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr] });
  await agent.waitForLog('reverse tunnel ready', 20_000);
  const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=alice', `--ca-pin=${pin}`], { env: env(), input: `${PASSWORD}\n` });
  expect(login.stderr).toBe('');
  const local = await startGwshProxy(['db', 'pg'], env(), children, { timeoutMs: 20_000 });
  port = local.port;
  gwshOutput = local.output;
}, 180_000);

afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  if (successorPid) {
    try {
      process.kill(successorPid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  await agent?.stop();
  await cluster?.stop();
  await pg?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

/** The agent's log lines (JSON) with msg containing text, the successor's included (it writes to the same pipes). */
const lines = (text: string) => agent.logs().split('\n').filter((l) => l.includes(text));

describeAsRoot('hand-over (SIGUSR2) and drain (SIGTERM) with a real psql', () => {
  it('a successor that cannot start: the old process keeps serving and says why', async () => {
    const good = await readFile(agent.configPath, 'utf8');
    await writeFile(agent.configPath, `${good}\nnot: [valid\n`);
    agent.process.kill('SIGUSR2');
    await agent.waitForLog('GW_ERR_HANDOVER_FAILED', 60_000);
    await writeFile(agent.configPath, good);
    const r = await psql('select 41');
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('41');
    expect(agent.process.exitCode).toBeNull();
  }, 120_000);

  it('a session opened before goes on in the old process; new sessions reach the successor; the old one exits after', async () => {
    const old = openPsql();
    old.send('select 1000 + 1;');
    await old.waitFor('1001');
    old.send("select 'old-' || pg_backend_pid();");
    await old.waitFor('old-');
    // The successor gets a short drain limit (its configuration is re-read), for the next test.
    await writeFile(agent.configPath, agentConfig('5s').replaceAll('DATA_DIR', agent.dataDir));
    agent.process.kill('SIGUSR2');
    await waitUntil('the ask is logged', () => lines('hand-over asked').length === 2, 30_000); // the first test's, and this one
    agent.process.kill('SIGUSR2'); // a second ask during the hand-over: refused, never two successors
    const ready = await agent.waitForLog('"successor_pid"', 90_000);
    successorPid = (JSON.parse(ready) as { successor_pid: number }).successor_pid;
    expect(successorPid).toBeGreaterThan(0);
    expect(successorPid).not.toBe(agent.process.pid);
    await waitUntil('the second ask is refused', () => lines('GW_ERR_HANDOVER_BUSY').length === 1, 30_000);
    expect(lines('hand-over: starting the successor').length).toBe(2); // the one that failed (first test), and this one
    expect(lines('telling the process before').length).toBe(1);
    // The old session, typed into after the hand-over.
    old.send('select 2000 + 2;');
    await old.waitFor('2002');
    // A new session: served by the successor (the old one refuses new dials once draining).
    const r = await psql('select 43');
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('43');
    // Which process served which session: the old one's opened before the hand-over, the new one's in the successor.
    const opened = lines('database session opened').map((l) => (JSON.parse(l) as { pid: number }).pid);
    expect(opened.at(-1)).toBe(successorPid);
    expect(opened).toContain(agent.process.pid);
    expect(agent.process.exitCode).toBeNull(); // still draining its session
    old.send('\\q');
    expect(await old.exited).toBe(0);
    await waitUntil('the old process exits once its session ended', () => agent.process.exitCode !== null, 60_000);
    // The successor serves on.
    const after = await psql('select 44');
    expect(after.stdout.trim()).toBe('44');
  }, 240_000);

  it('SIGTERM drains: the session in flight goes on, a new one is refused, the drain limit closes the rest', async () => {
    const s = openPsql();
    s.send('select 3000 + 3;');
    await s.waitFor('3003');
    process.kill(successorPid!, 'SIGTERM');
    await waitUntil('the successor drains', () => lines('draining (SIGTERM').length > 0, 30_000);
    s.send('select 4000 + 4;');
    await s.waitFor('4004');
    const refused = await psql('select 45');
    expect(refused.status).not.toBe(0);
    // psql sees the connection closed; `gwsh proxy db` prints why, with the code.
    await waitUntil('gwsh proxy names GW_ERR_AGENT_DRAINING', () => gwshOutput().includes('GW_ERR_AGENT_DRAINING'), 10_000);
    await waitUntil('the drain limit is reached', () => lines('GW_ERR_DRAIN_LIMIT').length > 0, 60_000);
    await waitUntil('the successor exits', () => {
      try {
        process.kill(successorPid!, 0);
        return false;
      } catch {
        return true;
      }
    }, 30_000);
    s.send('select 5;');
    expect(await s.exited).not.toBe(0);
    successorPid = undefined;
  }, 180_000);

  it('a second SIGTERM during the drain stops at once', async () => {
    const again = await startGateway(agentConfig('60s'), { dataDir: agent.dataDir });
    try {
      await again.waitForLog('reverse tunnel ready', 30_000);
      const s = openPsql();
      s.send('select 6000 + 6;');
      await s.waitFor('6006');
      again.process.kill('SIGTERM');
      await again.waitForLog('draining (SIGTERM', 30_000);
      s.send('select 7000 + 7;');
      await s.waitFor('7007');
      const exited = new Promise<number | null>((resolve) => again.process.once('exit', resolve));
      again.process.kill('SIGTERM');
      expect(await exited).toBe(1);
      expect(again.logs()).toContain('second stop signal: exiting now');
      s.send('select 8;');
      expect(await s.exited).not.toBe(0);
    } finally {
      await again.stop();
    }
  }, 120_000);
});
