set terminal pngcairo size 1200,700 font ',10'
set output 'reports/paper/refit_time.png.tmp.10213'
set termoption noenhanced
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set key top left
set xtics rotate by -35 scale 0
set grid ytics
set datafile missing 'NaN'
set offsets 0.6, 0.6, 0, 0
set ylabel 'refit time (s)'
set logscale y
set arrow from graph 0, first 150 to graph 1, first 150 nohead dt 2 lc rgb 'red'
set label 'paper, 1T 3% relay tree: 150 s' at graph 0.01, first 175 tc rgb 'red' front
set arrow from graph 0, first 75 to graph 1, first 75 nohead dt 3 lc rgb 'dark-green'
set label 'target: 75 s' at graph 0.01, first 62 tc rgb 'dark-green' front
plot 'reports/paper/refit_time.dat' using 2:xtic(1) title 'full/object_store', 'reports/paper/refit_time.dat' using 3 title 'delta/object_store', 'reports/paper/refit_time.dat' using 4 title 'full/relay_tree', 'reports/paper/refit_time.dat' using 5 title 'delta/relay_tree'
