/**
 * The "container" of the stand-in API server: `kubectl exec` runs a real process on this machine (in the pod's
 * own temp directory, with only PATH in its environment), with a pseudo-terminal from node-pty when the request
 * says tty=true (resize messages resize it), else plain pipes (stdin closed when the client closes it: SPDY's
 * half-close or the v5 WebSocket protocol's CLOSE signal). When the process exits, the error channel carries the
 * Status the kubelet sends: Success, or NonZeroExitCode with the code as the ExitCode cause (kubectl exits with
 * it); a command that cannot start gets the InternalError the container runtime's refusal becomes.
 *
 * Not the real thing: no namespaces, no cgroups, no image: the test's own machine is the container. The
 * transports (websocket.ts, spdy.ts) only move bytes; this file decides what runs and what is reported.
 */
import { spawn } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import * as nodePty from 'node-pty';
import { exitStatus, failure, SUCCESS, type Status } from './status.js';

export interface ExecIo {
  stdin?: Readable;
  stdout?: Writable;
  stderr?: Writable;
  /** Called by the transport for each terminal size the client sends. */
  onResize(cb: (cols: number, rows: number) => void): void;
  /** The Status for the error channel; the transport sends it after the output (endOutputs) and closes. */
  finish(status: Status): void;
}

/**
 * Ends the output streams and calls `then` once each has flushed (or is gone): what was written to them has
 * then been handed to the connection, so the Status and the close the transport sends next come after it on
 * the wire, as the kubelet's (it writes the Status once the exec's copies have returned). Before, the Status
 * could overtake output still queued in a writer, and the close then dropped that output.
 */
export function endOutputs(outputs: Array<Writable | undefined>, then: () => void): void {
  const open = outputs.filter((w): w is Writable => w !== undefined && !w.destroyed && !(w as { _writableState?: { finished?: boolean } })._writableState?.finished);
  let left = open.length + 1;
  const one = () => { if (--left === 0) then(); };
  for (const w of open) {
    let done = false;
    const once = () => { if (!done) { done = true; one(); } };
    w.once('finish', once);
    w.once('close', once);
    w.once('error', once);
    w.end();
  }
  one();
}

export interface ExecRequest {
  command: string[];
  tty: boolean;
  cwd: string;
}

export function execOptions(url: URL): { command: string[]; container: string | null; stdin: boolean; stdout: boolean; stderr: boolean; tty: boolean } {
  const flag = (k: string) => url.searchParams.get(k) === 'true' || url.searchParams.get(k) === '1';
  return { command: url.searchParams.getAll('command'), container: url.searchParams.get('container'), stdin: flag('stdin'), stdout: flag('stdout'), stderr: flag('stderr'), tty: flag('tty') };
}

function cannotStart(command: string[], err: Error): Status {
  return failure(500, 'InternalError', `Internal error occurred: error executing command in container: failed to exec in container: exec: "${command[0] ?? ''}": ${err.message}`);
}

function runPty(r: ExecRequest, io: ExecIo): () => void {
  let pty: nodePty.IPty;
  try {
    pty = nodePty.spawn(r.command[0]!, r.command.slice(1), { cols: 80, rows: 24, cwd: r.cwd, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', TERM: 'xterm' } });
  } catch (err) {
    io.finish(cannotStart(r.command, err as Error));
    return () => undefined;
  }
  pty.onData((d) => io.stdout?.write(d));
  io.stdin?.on('data', (d: Buffer) => pty.write(d.toString('utf8')));
  io.onResize((cols, rows) => { try { pty.resize(cols, rows); } catch { /* already gone */ } });
  pty.onExit(({ exitCode }) => setImmediate(() => io.finish(exitCode === 0 ? SUCCESS : exitStatus(r.command, exitCode))));
  return () => { try { pty.kill(); } catch { /* already gone */ } };
}

function runPipes(r: ExecRequest, io: ExecIo): () => void {
  const child = spawn(r.command[0]!, r.command.slice(1), { cwd: r.cwd, env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, stdio: ['pipe', 'pipe', 'pipe'] });
  let failed: Error | undefined;
  child.on('error', (err) => { failed = err; });
  child.stdin.on('error', () => undefined);
  if (io.stdin) io.stdin.pipe(child.stdin);
  else child.stdin.end();
  if (io.stdout) child.stdout.pipe(io.stdout, { end: false });
  else child.stdout.resume();
  if (io.stderr) child.stderr.pipe(io.stderr, { end: false });
  else child.stderr.resume();
  // 'close' comes after the process has exited and its stdout and stderr have ended: all output is written first.
  child.on('close', (code, signal) => {
    if (failed) io.finish(cannotStart(r.command, failed));
    else io.finish(code === 0 ? SUCCESS : exitStatus(r.command, code ?? (signal ? 128 + 9 : 1)));
  });
  return () => child.kill('SIGKILL');
}

/** Starts the command; returns a function that kills it (the client went away). */
export function runCommand(r: ExecRequest, io: ExecIo): () => void {
  if (r.command.length === 0) {
    io.finish(failure(400, 'BadRequest', 'you must specify at least 1 command'));
    return () => undefined;
  }
  return r.tty ? runPty(r, io) : runPipes(r, io);
}
