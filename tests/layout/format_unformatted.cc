// The format check's counterexample: not what clang-format makes of it, so that
// layout.format_can_fail can show the check fails on such a file.
int   Add( int a,int b ){return a+b;}
