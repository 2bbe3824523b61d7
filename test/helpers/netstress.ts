/**
 * A stressor for the machine's network: what other work on a shared machine does (the network-namespace tests, a
 * container engine), in a loop, so that a test can prove it does not disturb what it must not. Each cycle adds a
 * network namespace and a veth pair from the machine's own namespace into it, gives this side an address and brings
 * it up (the events Chromium's netlink watcher reads as "the network changed"), then deletes both, as
 * test/helpers/netns.ts's test hosts do.
 *
 * "The machine's own namespace" is the one scripts/netns-run.sh ran in (GW_MACHINE_NETNS: its shell's, which stays
 * there), entered with nsenter: a test that runs in a namespace of its own stresses the machine around it, not
 * itself. Run otherwise, the machine's namespace is this process's own. (PID 1's is not used: a container may
 * refuse to open it even to root.) Addresses are /32s of 198.19.0.0/16
 * (RFC 2544's benchmarking block: nothing on the machine routes to them), names start with gwstress; stop()
 * deletes whatever the last cycle left. Needs root.
 *
 * cycles() counts the completed cycles (one line of the loop's output each), so that a test can wait until the
 * network has changed a given number of times instead of sleeping.
 */
import { spawn, spawnSync } from 'node:child_process';
import { randomInt } from 'node:crypto';

export interface NetworkStress {
  /** Completed add-and-delete cycles so far. */
  cycles(): number;
  /** Resolves once `n` more cycles have completed than when it was called (rejects when the loop has died). */
  waitCycles(n: number): Promise<void>;
  stop(): Promise<void>;
}

/** The namespace of the machine, where other work changes the network. */
export function machineNetns(): string {
  return process.env.GW_MACHINE_NETNS ?? `/proc/${process.pid}/ns/net`;
}

export function startNetworkStress(options: { netns?: string } = {}): NetworkStress {
  const netns = options.netns ?? machineNetns();
  const tag = randomInt(0, 36 ** 4).toString(36);
  const link = `gwstress${tag}`;
  const ns = `gwstress-${tag}`;
  const peer = `gwstresp${tag}`;
  const addr = `198.19.${randomInt(0, 256)}.${randomInt(1, 255)}/32`;
  const loop = [
    'while :; do',
    `ip netns add ${ns} && ip link add ${link} type veth peer name ${peer} netns ${ns} && ip addr add ${addr} dev ${link} && ip link set ${link} up || exit 1`,
    `ip link del ${link} && ip netns del ${ns} || exit 1`,
    'echo cycle',
    'done',
  ].join('\n');
  const child = spawn('nsenter', [`--net=${netns}`, 'sh', '-c', loop], { stdio: ['ignore', 'pipe', 'pipe'] });
  let count = 0;
  let stderr = '';
  let ended: Error | undefined;
  const waiters = new Set<() => void>();
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
    count += chunk.split('\n').filter((l) => l === 'cycle').length;
    for (const w of waiters) w();
  });
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
    if (stderr.length < 4096) stderr += chunk;
  });
  child.once('exit', (code, signal) => {
    ended = new Error(`the network stressor ended (${signal ?? `exit ${code}`}): ${stderr.trim()}`);
    for (const w of waiters) w();
  });
  return {
    cycles: () => count,
    waitCycles(n) {
      const target = count + n;
      return new Promise<void>((resolve, reject) => {
        const check = () => {
          if (count >= target) {
            waiters.delete(check);
            resolve();
          } else if (ended) {
            waiters.delete(check);
            reject(ended);
          }
        };
        waiters.add(check);
        check();
      });
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGKILL');
        await exited;
      }
      spawnSync('nsenter', [`--net=${netns}`, 'ip', 'link', 'del', link], { stdio: 'ignore' });
      spawnSync('nsenter', [`--net=${netns}`, 'ip', 'netns', 'del', ns], { stdio: 'ignore' });
    },
  };
}
