/** Facts about other processes of this machine, for the locks and pid files that must not be taken twice. */

/** Whether a process with this pid exists (EPERM: it exists but belongs to another user). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
