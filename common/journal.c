/* journal.c: kw_journal_stderr() (kw_journal.h). */
#include "kw_journal.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

bool kw_journal_stderr(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    if (js == NULL || sscanf(js, "%llu:%llu", &dev, &ino) != 2 ||
        fstat(2, &st) < 0)
        return false;
    return (unsigned long long)st.st_dev == dev &&
           (unsigned long long)st.st_ino == ino;
}
